/*
 * SKEL_EXPORT marks what a skel library exports: its invoke entry (looked up
 * by remotectl with dlsym) and its implementation API. Everything else is
 * hidden (the builds pass -fvisibility=hidden), so the helpers linked into
 * both skel libraries never clash when one process loads both.
 */
#ifndef NPUD_SKEL_EXPORT_H
#define NPUD_SKEL_EXPORT_H

#define SKEL_EXPORT __attribute__((visibility("default")))

#endif /* NPUD_SKEL_EXPORT_H */

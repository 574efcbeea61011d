/*
 * domain.h -- the Hexagon SDK example header htp-drv.cpp includes, for its
 * supported_domains[] (used by htpdrv_get_domain, which ggml-hexagon.cpp does not
 * call). Written for npud.
 */
#ifndef NPUD_HTP_DOMAIN_H
#define NPUD_HTP_DOMAIN_H

#include <stdbool.h>

#include <remote.h>

static domain_t supported_domains[] = {
    {ADSP_DOMAIN_ID, ADSP_DOMAIN},
    {MDSP_DOMAIN_ID, MDSP_DOMAIN},
    {SDSP_DOMAIN_ID, SDSP_DOMAIN},
    {CDSP_DOMAIN_ID, CDSP_DOMAIN},
    {CDSP1_DOMAIN_ID, CDSP1_DOMAIN},
};

static inline bool is_CDSP(int domain_id) {
    return domain_id == CDSP_DOMAIN_ID || domain_id == CDSP1_DOMAIN_ID;
}

#endif /* NPUD_HTP_DOMAIN_H */

/*
 * dlopen_check.c -- load npud's libcdsprpc the way llama.cpp's Hexagon backend
 * does (htp-drv.cpp: dlopen("libcdsprpc.so", RTLD_NOW | RTLD_LOCAL), dlsym of
 * each entry point) and print, for each name on the command line, "name 1" if
 * the library has it and "name 0" if not.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    void *lib = dlopen("libcdsprpc.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        printf("%s %d\n", argv[i], dlsym(lib, argv[i]) != NULL);
    }
    return 0;
}

/* The ABI promises, checked on the host: version, status names, the header compiling as C99
 * and C++, and exactly the public tk_* functions exported from the shared library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/tk_test.h"

Test(abi, version_matches_header) {
    cr_assert_eq(tk_version(), TK_VERSION_NUMBER);
    cr_assert_eq(TK_VERSION_NUMBER, TK_VERSION_MAJOR * 10000 + TK_VERSION_MINOR * 100 + TK_VERSION_PATCH);
}

Test(abi, status_names_and_groups) {
    const struct { tk_status s; const char *name; int group; } all[] = {
        {TK_SUCCESS, "TK_SUCCESS", 0},
        {TK_ERROR_NULL_POINTER, "TK_ERROR_NULL_POINTER", 1},
        {TK_ERROR_INVALID_VALUE, "TK_ERROR_INVALID_VALUE", 1},
        {TK_ERROR_OVERLAP, "TK_ERROR_OVERLAP", 1},
        {TK_ERROR_MISALIGNED, "TK_ERROR_MISALIGNED", 1},
        {TK_ERROR_NOT_SUPPORTED, "TK_ERROR_NOT_SUPPORTED", 2},
        {TK_ERROR_ARCH_NOT_SUPPORTED, "TK_ERROR_ARCH_NOT_SUPPORTED", 2},
        {TK_ERROR_NO_DEVICE, "TK_ERROR_NO_DEVICE", 3},
        {TK_ERROR_CUDA, "TK_ERROR_CUDA", 3},
        {TK_ERROR_INTERNAL, "TK_ERROR_INTERNAL", 4},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        cr_assert_str_eq(tk_status_string(all[i].s), all[i].name);
        cr_assert_eq(TK_STATUS_GROUP(all[i].s), all[i].group, "%s", all[i].name);
    }
    cr_assert_str_eq(tk_status_string((tk_status)12345), "TK_UNKNOWN_STATUS");
}

Test(abi, last_error_is_per_call_and_names_the_function) {
    cr_assert_eq(tk_device_query(NULL), TK_ERROR_NULL_POINTER);
    cr_assert(strstr(tk_last_error(), "tk_device_query") && strstr(tk_last_error(), "'info'"),
              "message: %s", tk_last_error());
    tk_device_info small = TK_DEVICE_INFO_INIT;
    small.size = 4;
    cr_assert_eq(tk_device_query(&small), TK_ERROR_INVALID_VALUE);
    cr_assert(strstr(tk_last_error(), "TK_DEVICE_INFO_INIT"), "message: %s", tk_last_error());
    cr_assert_eq(tk_experimental_force_variant("activation", NULL), TK_SUCCESS);
    cr_assert_str_empty(tk_last_error());
}

static int run(const char *cmd) {
    int rc = system(cmd);
    return rc;
}

Test(abi, header_compiles_as_c99_and_cxx) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "printf '#include <tkern.h>\\nint main(void) { return tk_version() == TK_VERSION_NUMBER ? 0 : 1; }\\n' | "
             "%s -std=c99 -Wall -Wextra -pedantic -Werror -fsyntax-only -I%s/include -x c -",
             TK_CC, TK_SOURCE_DIR);
    cr_assert_eq(run(cmd), 0, "header does not compile as C99: %s", cmd);
    snprintf(cmd, sizeof cmd,
             "printf '#include <tkern.h>\\nint main() { tk_glu_params p = TK_GLU_PARAMS_INIT; return (int)p.kind; }\\n' | "
             "%s -std=c++11 -Wall -Wextra -pedantic -Werror -fsyntax-only -I%s/include -x c++ -",
             TK_CXX, TK_SOURCE_DIR);
    cr_assert_eq(run(cmd), 0, "header does not compile as C++: %s", cmd);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* Every exported symbol is a tk_* function declared TK_API in the header, and every TK_API
 * declaration is exported. */
Test(abi, exports_exactly_the_public_functions) {
    char *header = read_file(TK_SOURCE_DIR "/include/tkern.h");
    int declared = 0; /* declarations are the lines that start with "TK_API " */
    for (const char *p = header; (p = strstr(p, "\nTK_API ")) != NULL; p++)
        declared++;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only %s/lib/libtkern.so | awk '$2 ~ /^[TtDdBbRr]$/ {print $3}'",
             TK_BUILD_DIR);
    FILE *nm = popen(cmd, "r");
    cr_assert(nm, "cannot run nm");
    char line[256];
    int exported = 0;
    while (fgets(line, sizeof line, nm)) {
        line[strcspn(line, "@\n")] = '\0';
        cr_assert(strncmp(line, "tk_", 3) == 0, "exported symbol %s is not tk_*", line);
        char needle[300];
        snprintf(needle, sizeof needle, "%s(", line);
        cr_assert(strstr(header, needle) != NULL, "exported %s is not declared in tkern.h", line);
        exported++;
    }
    cr_assert_eq(pclose(nm), 0, "nm failed");
    cr_assert_eq(exported, declared, "%d symbols exported, %d TK_API functions declared", exported, declared);
    free(header);
}

/* Checks on the kernels' source text (host only). CUDA 13.0's front end silently dropped a
 * `#pragma unroll` loop, and the barrier after it, that followed a discarded `if constexpr`
 * whose unbraced body was itself a loop: a 10-line kernel reproduces it at -Xcicc -O0, and in
 * the head-dim-256 attention backward it removed the dS^T / P^T stores, so the gradients came
 * from stale shared memory, different on every run, with nothing for compute-sanitizer to see.
 * The rule here: in cuda/, the statement after an `if constexpr (...)` that ends its line (no
 * brace) must not be a loop or a pragma: brace such bodies. The check is textual. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "support/tk_test.h"

static bool starts_loop(const char *t) {
    return strncmp(t, "#pragma", 7) == 0 || strncmp(t, "for ", 4) == 0 || strncmp(t, "for(", 4) == 0 ||
           strncmp(t, "while", 5) == 0 || strncmp(t, "do ", 3) == 0 || strncmp(t, "do{", 3) == 0;
}

/* The number of `if constexpr` lines in path; fails on an unbraced one over a loop. */
static int check_file(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f != NULL, "cannot open %s", path);
    char line[1024], pending[1024] = "";
    int n = 0, pending_line = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        const char *t = line + strspn(line, " \t");
        if (*t == '\n' || *t == '\r' || *t == '\0')
            continue;
        if (pending_line) {
            cr_assert(!starts_loop(t), "%s:%d: unbraced `if constexpr` over a loop (%s): brace its body", path,
                      pending_line, pending);
            pending_line = 0;
        }
        const char *c = strstr(t, "if constexpr");
        if (c == NULL)
            continue;
        found++;
        const char *end = line + strcspn(line, "\r\n");
        while (end > c && end[-1] == ' ')
            end--;
        if (end > c && end[-1] == ')') { /* the condition ends the line: its statement is on the next */
            pending_line = n;
            snprintf(pending, sizeof pending, "%.*s", (int)(end - t), t);
        }
    }
    fclose(f);
    return found;
}

static int check_dir(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert(d != NULL, "cannot open %s", dir);
    int found = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const size_t len = strlen(e->d_name);
        const bool cu = len > 3 && strcmp(e->d_name + len - 3, ".cu") == 0;
        const bool cuh = len > 4 && strcmp(e->d_name + len - 4, ".cuh") == 0;
        if (!cu && !cuh)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        found += check_file(path);
    }
    closedir(d);
    return found;
}

Test(kernel_source, if_constexpr_loops_are_braced) {
    const int found = check_dir(TK_SOURCE_DIR "/cuda") + check_dir(TK_SOURCE_DIR "/cuda/core");
    cr_assert(found > 0, "no `if constexpr` found under cuda/: is TK_SOURCE_DIR right?");
}

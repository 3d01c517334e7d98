/* Keep or drop a frame's tensors by name (lrmoe-route --loads-only, and any
 * filter that thins a stream). */
#include <string.h>
#include "lrmoe.h"

static int listed(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(name, names[i])) return 1;
    return 0;
}

/* Delete every tensor whose name is (keep = 0) or is not (keep = 1) among
 * names[0..n); attributes stay. Returns the number deleted. */
static int thin(lrmoe_frame_t *f, const char *const *names, int n, int keep)
{
    int deleted = 0;
    for (int i = f->ntensors - 1; i >= 0; i--) {
        const char *nm = f->tensors[i]->name;
        if (listed(nm, names, n) != keep) {
            if (lrmoe_frame_del(f, nm) != 1)
                return lrmoe_err("tensor %s: could not be removed", nm);
            deleted++;
        }
    }
    return deleted;
}

int lrmoe_frame_keep_only(lrmoe_frame_t *f, const char *const *names, int n)
{
    return thin(f, names, n, 1);
}

int lrmoe_frame_drop(lrmoe_frame_t *f, const char *const *names, int n)
{
    return thin(f, names, n, 0);
}

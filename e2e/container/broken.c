/* The broken candidate of the container lab: `version` answers (it passes the candidate
 * check), anything else — the daemon — exits 1 at once, so the agent unit crash-loops and
 * the recovery unit must roll back. image/build --binary packs it with its loader and libc. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "version") == 0) {
        puts("flexnode 0.0.0-broken");
        return 0;
    }
    fputs("flexnode (broken lab build): refusing to run\n", stderr);
    return 1;
}

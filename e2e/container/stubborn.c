/* The container lab's daemon that ignores SIGTERM: `version` answers; otherwise it tells
 * systemd it is ready (NOTIFY_SOCKET, as the agent unit's Type=notify wants), ignores
 * SIGTERM and sleeps forever, so only the unit's SIGKILL at TimeoutStopSec ends it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "version") == 0) {
        puts("flexnode 0.0.0-stubborn");
        return 0;
    }
    signal(SIGTERM, SIG_IGN);
    const char *path = getenv("NOTIFY_SOCKET");
    if (path && strlen(path) < sizeof(((struct sockaddr_un *)0)->sun_path)) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        strcpy(addr.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
        if (fd >= 0)
            sendto(fd, "READY=1", 7, 0, (struct sockaddr *)&addr, sizeof(addr));
    }
    fputs("flexnode (stubborn lab build): ready, ignoring SIGTERM\n", stderr);
    for (;;)
        pause();
}

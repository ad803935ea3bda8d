/* holdopen: stand in for a display server, for the tier-3 split-session checks.
 *
 *   holdopen NAME PATH   open PATH (O_RDWR | O_NONBLOCK | O_CLOEXEC), set this process's
 *                        name (comm) to NAME, print "holding PATH as NAME (pid N)", and
 *                        wait until killed
 *
 * A compositor holds its GPU's primary node open like this (directly, or through the fd
 * systemd-logind hands it). Exit status 1 if PATH cannot be opened, 2 on bad usage.
 * Built by tests/vm/auto-tests.sh with `gcc -static -O2` and added as /bin/holdopen.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: holdopen NAME PATH\n");
		return 2;
	}
	fd = open(argv[2], O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		perror(argv[2]);
		return 1;
	}
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	printf("holding %s as %s (pid %d)\n", argv[2], argv[1], (int)getpid());
	fflush(stdout);
	for (;;)
		pause();
}

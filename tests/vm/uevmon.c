/* uevmon: log kernel uevents, for the tier-3 automation tests.
 *
 *   uevmon [KEY=VALUE...]   print each kernel uevent that carries one of the given fields
 *                           (every uevent without arguments)
 *
 * One line per event: "UEVENT <seconds.millis> ACTION@DEVPATH KEY=VALUE ...", the time being
 * CLOCK_BOOTTIME (what /proc/uptime shows), so a guest script can measure how long after
 * the kernel's event something happened. Listens on NETLINK_KOBJECT_UEVENT group 1 (the
 * kernel's own broadcasts) and skips datagrams a process sent. Runs until killed.
 *
 * Built by tests/vm/auto-tests.sh with `gcc -static -O2` and added to the guest as
 * /bin/uevmon.
 */
#include <linux/netlink.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int wanted(const char *buf, size_t n, int argc, char **argv)
{
	if (argc < 2)
		return 1;
	for (const char *p = buf; p < buf + n; p += strlen(p) + 1)
		for (int i = 1; i < argc; i++)
			if (strcmp(p, argv[i]) == 0)
				return 1;
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_nl sa = {.nl_family = AF_NETLINK, .nl_groups = 1};
	int s = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
	static char buf[16384];

	if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("uevmon");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("uevmon: listening\n");
	for (;;) {
		struct sockaddr_nl from;
		socklen_t fl = sizeof(from);
		ssize_t n = recvfrom(s, buf, sizeof(buf) - 1, 0, (struct sockaddr *)&from, &fl);
		struct timespec ts;

		if (n <= 0 || from.nl_pid != 0)
			continue;
		buf[n] = 0;
		if (!wanted(buf, (size_t)n, argc, argv))
			continue;
		clock_gettime(CLOCK_BOOTTIME, &ts);
		printf("UEVENT %ld.%03ld", (long)ts.tv_sec, ts.tv_nsec / 1000000);
		for (const char *p = buf; p < buf + n; p += strlen(p) + 1)
			printf(" %s", p);
		printf("\n");
	}
}

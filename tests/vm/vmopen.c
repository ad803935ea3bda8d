/* vmopen: report whether paths can be opened, for the tier-3 guest tests.
 *
 *   vmopen PATH [PATH...]        open(PATH, O_RDONLY | O_NONBLOCK | O_CLOEXEC), then close
 *   vmopen --stat PATH [PATH...] stat(PATH) instead
 *
 * Prints one line per path: "PATH ok", or "PATH ENOENT" / "EPERM" / "ENXIO" / "EACCES" /
 * "ENODEV" / "E<errno>" (a number when the name is not in the short list below). Never
 * reads: a read on a DRM fd blocks. Exit status: 0 if every path was ok, 1 if any failed,
 * 2 on bad usage.
 *
 * Built by tests/vm/guest-tests.sh with `gcc -static -O2` and added to the guest as
 * /bin/vmopen.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *errname(int e)
{
	static char buf[32];

	switch (e) {
	case ENOENT:
		return "ENOENT";
	case EPERM:
		return "EPERM";
	case EACCES:
		return "EACCES";
	case ENXIO:
		return "ENXIO";
	case ENODEV:
		return "ENODEV";
	case EBUSY:
		return "EBUSY";
	case EINVAL:
		return "EINVAL";
	case EIO:
		return "EIO";
	case ENOTDIR:
		return "ENOTDIR";
	case EFAULT:
		return "EFAULT";
	}
	snprintf(buf, sizeof(buf), "E%d", e);
	return buf;
}

int main(int argc, char **argv)
{
	int use_stat = 0, failed = 0, i = 1;

	if (i < argc && strcmp(argv[i], "--stat") == 0) {
		use_stat = 1;
		i++;
	}
	if (i >= argc) {
		fprintf(stderr, "usage: vmopen [--stat] PATH [PATH...]\n");
		return 2;
	}
	for (; i < argc; i++) {
		int err = 0;

		if (use_stat) {
			struct stat st;

			if (stat(argv[i], &st) != 0)
				err = errno;
		} else {
			int fd = open(argv[i], O_RDONLY | O_NONBLOCK | O_CLOEXEC);

			if (fd < 0)
				err = errno;
			else
				close(fd);
		}
		printf("%s %s\n", argv[i], err ? errname(err) : "ok");
		if (err)
			failed = 1;
	}
	return failed;
}

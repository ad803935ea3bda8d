/* drmprobe: enumerate GPUs the way Mesa, Xorg and compositors do, with the real libdrm.
 *
 *   drmprobe
 *
 * Calls drmGetDevices2(0, …) (what Mesa's loader and Vulkan drivers call), then, for each
 * device, opens its primary and render nodes the way Mesa's loader_open_device() does
 * (O_RDWR | O_CLOEXEC) and closes them again. Prints
 *
 *   drmGetDevices2 N
 *   pci-DDDD_BB_DD_F VVVV:DDDD card=PATH:RESULT render=PATH:RESULT usable=yes|no
 *
 * per device, in libdrm's order, where RESULT is ok or an errno name and `usable` says
 * whether any node opened (a Vulkan driver or the GL loader skips a device it cannot
 * open). Exit status: 0 when drmGetDevices2 succeeded, 1 when it failed (its error is
 * printed), 2 on bad usage.
 *
 * Built by tests/vm/guest-tests.sh against the host's libdrm (package libdrm-dev) and run
 * in the guest with the host's libdrm.so.2 and glibc.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xf86drm.h>

#define MAX_DEVICES 64

static const char *try_open(const char *path)
{
	static char buf[32];
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd >= 0) {
		close(fd);
		return "ok";
	}
	switch (errno) {
	case ENOENT:
		return "ENOENT";
	case EPERM:
		return "EPERM";
	case EACCES:
		return "EACCES";
	}
	snprintf(buf, sizeof(buf), "E%d", errno);
	return buf;
}

int main(int argc, char **argv)
{
	drmDevicePtr devs[MAX_DEVICES];
	int n, i;

	(void)argv;
	if (argc != 1) {
		fprintf(stderr, "usage: drmprobe\n");
		return 2;
	}
	n = drmGetDevices2(0, devs, MAX_DEVICES);
	if (n < 0) {
		printf("drmGetDevices2 error %s\n", strerror(-n));
		return 1;
	}
	printf("drmGetDevices2 %d\n", n);
	for (i = 0; i < n; i++) {
		drmDevicePtr d = devs[i];
		const char *card = "-", *render = "-";
		const char *card_path = "-", *render_path = "-";
		int usable = 0;

		if (d->available_nodes & (1 << DRM_NODE_PRIMARY)) {
			card_path = d->nodes[DRM_NODE_PRIMARY];
			card = try_open(card_path);
			usable |= strcmp(card, "ok") == 0;
		}
		if (d->available_nodes & (1 << DRM_NODE_RENDER)) {
			render_path = d->nodes[DRM_NODE_RENDER];
			render = try_open(render_path);
			usable |= strcmp(render, "ok") == 0;
		}
		if (d->bustype == DRM_BUS_PCI)
			printf("pci-%04x_%02x_%02x_%u %04x:%04x", d->businfo.pci->domain,
			       d->businfo.pci->bus, d->businfo.pci->dev, d->businfo.pci->func,
			       d->deviceinfo.pci->vendor_id, d->deviceinfo.pci->device_id);
		else
			printf("bus%d ?:?", d->bustype);
		printf(" card=%s:%s render=%s:%s usable=%s\n", card_path, card, render_path, render,
		       usable ? "yes" : "no");
	}
	drmFreeDevices(devs, n);
	return 0;
}

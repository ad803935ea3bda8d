# gpuctl — build, test, install.
#
#   make deps      install what a fresh Debian 12 machine lacks (safe to re-run)
#   make build     debug build
#   make static    the single static binary (static-pie, no dynamic loader)
#   make test      every test this machine can run (root tiers run as root)
#   make lint      rustfmt, clippy -D warnings, clang-format on bpf/
#   make demo      a real denial on a fixture laptop, in a few lines
#   make install   PREFIX=/usr/local DESTDIR=
#   make clean

PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR  ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
USERUNITDIR ?= $(PREFIX)/lib/systemd/user
SYSCONFDIR ?= /etc
MANDIR  ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share
CARGO   ?= cargo
TARGET  := x86_64-unknown-linux-gnu
STATIC_BIN := target/$(TARGET)/release/gpuctl
CLANG_FORMAT ?= clang-format

APT_PACKAGES := clang llvm libelf-dev zlib1g-dev pkg-config clang-format \
	qemu-system-x86 busybox-static kmod cpio xz-utils binutils shellcheck file gcc libc6-dev \
	bubblewrap libdrm-dev \
	acpica-tools \
	dbus sway waybar grim desktop-file-utils

.PHONY: all deps build static test test-install test-unit test-vm lint fmt demo bench bench-vm-lsm install uninstall clean

all: build

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "apt packages: all present"; fi
	@rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
	$(CARGO) fetch --locked

build:
	$(CARGO) build --locked

static:
	RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --locked --release --target $(TARGET)
	@file $(STATIC_BIN) 2>/dev/null || true
	@ls -l $(STATIC_BIN)

test: static test-install
	$(CARGO) test --locked -- --test-threads=4
	@if [ -d tests/vm ] && [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-vm; fi

# `make install` into a scratch DESTDIR lays out every file a package ships.
test-install:
	@d=$$(mktemp -d) && $(MAKE) --no-print-directory install DESTDIR=$$d PREFIX=/usr >/dev/null && \
	for f in usr/bin/gpuctl usr/lib/systemd/system/gpuctl.service etc/gpuctl/gpuctl.toml.example \
		usr/share/man/man1/gpuctl.1 usr/share/bash-completion/completions/gpuctl \
		usr/share/zsh/site-functions/_gpuctl usr/share/fish/vendor_completions.d/gpuctl.fish \
		usr/lib/systemd/user/gpuctl-tray.service etc/xdg/autostart/gpuctl-tray.desktop; do \
		test -s $$d/$$f || { echo "make install did not install $$f"; exit 1; }; done && \
	grep -q '^ExecStart=/usr/bin/gpuctl daemon' $$d/usr/lib/systemd/system/gpuctl.service && \
	grep -q '^ExecStart=/usr/bin/gpuctl tray$$' $$d/usr/lib/systemd/user/gpuctl-tray.service && \
	grep -q '^Exec=/usr/bin/gpuctl tray$$' $$d/etc/xdg/autostart/gpuctl-tray.desktop && \
	if command -v desktop-file-validate >/dev/null; then \
		desktop-file-validate $$d/etc/xdg/autostart/gpuctl-tray.desktop; fi && \
	file $$d/usr/bin/gpuctl | grep -q 'static-pie linked' && \
	if command -v systemd-analyze >/dev/null; then \
		sed "s|/usr/bin/gpuctl|$$d/usr/bin/gpuctl|" $$d/usr/lib/systemd/system/gpuctl.service \
			> $$d/gpuctl.service && systemd-analyze verify --man=no $$d/gpuctl.service; \
	else echo "systemd-analyze not found: unit not verified"; fi && \
	echo "install: 1 passed, 0 failed" && rm -rf $$d

test-unit:
	$(CARGO) test --locked

test-vm: static
	tests/vm/guest-tests.sh $(STATIC_BIN)
	tests/vm/auto-tests.sh $(STATIC_BIN)
	tests/vm/power-tests.sh $(STATIC_BIN)

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(CLANG_FORMAT) --dry-run --Werror bpf/*.c bpf/*.h bench/*.c tests/vm/*.c
	shellcheck -x .ci/run tests/*.sh tests/vm/*.sh $(wildcard bench/*.sh)

fmt:
	$(CARGO) fmt
	$(CLANG_FORMAT) -i bpf/*.c bpf/*.h bench/*.c tests/vm/*.c

demo: build
	tests/demo.sh target/debug/gpuctl

bench: static
	bench/run.sh $(STATIC_BIN)

# The lsm backend's per-program cost, in the QEMU tier (TCG: ratios only).
bench-vm-lsm: static
	bench/vm-lsm.sh $(STATIC_BIN)

install: static
	install -D -m 0755 $(STATIC_BIN) $(DESTDIR)$(BINDIR)/gpuctl
	install -D -m 0644 packaging/systemd/gpuctl.service $(DESTDIR)$(UNITDIR)/gpuctl.service
	sed -i 's|/usr/bin/gpuctl|$(BINDIR)/gpuctl|' $(DESTDIR)$(UNITDIR)/gpuctl.service
	install -D -m 0644 packaging/gpuctl.toml $(DESTDIR)$(SYSCONFDIR)/gpuctl/gpuctl.toml.example
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DATADIR)/bash-completion/completions \
		$(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	$(STATIC_BIN) manpage > $(DESTDIR)$(MANDIR)/man1/gpuctl.1
	$(STATIC_BIN) completions bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/gpuctl
	$(STATIC_BIN) completions zsh > $(DESTDIR)$(DATADIR)/zsh/site-functions/_gpuctl
	$(STATIC_BIN) completions fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/gpuctl.fish
	install -D -m 0644 packaging/systemd/gpuctl-tray.service $(DESTDIR)$(USERUNITDIR)/gpuctl-tray.service
	sed -i 's|/usr/bin/gpuctl|$(BINDIR)/gpuctl|' $(DESTDIR)$(USERUNITDIR)/gpuctl-tray.service
	install -D -m 0644 packaging/desktop/gpuctl-tray.desktop $(DESTDIR)$(SYSCONFDIR)/xdg/autostart/gpuctl-tray.desktop
	sed -i 's|^Exec=gpuctl|Exec=$(BINDIR)/gpuctl|' $(DESTDIR)$(SYSCONFDIR)/xdg/autostart/gpuctl-tray.desktop

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/gpuctl $(DESTDIR)$(UNITDIR)/gpuctl.service \
		$(DESTDIR)$(SYSCONFDIR)/gpuctl/gpuctl.toml.example $(DESTDIR)$(MANDIR)/man1/gpuctl.1 \
		$(DESTDIR)$(DATADIR)/bash-completion/completions/gpuctl \
		$(DESTDIR)$(DATADIR)/zsh/site-functions/_gpuctl \
		$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/gpuctl.fish \
		$(DESTDIR)$(USERUNITDIR)/gpuctl-tray.service \
		$(DESTDIR)$(SYSCONFDIR)/xdg/autostart/gpuctl-tray.desktop

clean:
	$(CARGO) clean
	rm -rf .cache/vm/initramfs-*

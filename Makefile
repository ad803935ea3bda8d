# gpuctl — build, test, install.
#
#   make deps      install what a fresh Debian 12 machine lacks (safe to re-run)
#   make build     debug build
#   make static    the single static binary (static-pie, no dynamic loader)
#   make check     the inner loop: rustfmt, clippy -D warnings, then `make test-unit`
#   make test-unit unit and unprivileged integration tests (root tests reported as ignored)
#   make test-root the root tests (`cargo test -- --ignored`); as root
#   make test-vm   the QEMU tier: stock kernel, real DRM nodes, D3cold, AC adapter
#   make test      every test this machine can run: test-install, unit, integration
#                  (root tests too, as root), then test-vm and test-distro as root
#   make lint      rustfmt, clippy -D warnings, clang-format, shellcheck
#   make demo      a real denial on a fixture laptop, in a few lines
#   make install   PREFIX=/usr/local DESTDIR=
#   make dist      the release source tarball, crates vendored (builds offline)
#   make test-distro  build the .deb/.rpm/Arch packages, boot Debian 12 with the .deb (root)
#   make clean
#
# HACKING.md says what each test target runs, how long it takes and how to run one test.
#
# Packagers: CARGOFLAGS=--frozen (offline, in the tarball of `make dist`), STRIP=0 (keep
# symbols and line tables for debug packages), STATIC=0 (link glibc, libelf and zlib
# dynamically; libbpf is always built in), TRAY=0 (no `gpuctl tray`: no D-Bus crates in the
# binary, no tray unit or autostart entry installed). RUSTFLAGS/CFLAGS from the environment
# are kept.

PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR  ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
USERUNITDIR ?= $(PREFIX)/lib/systemd/user
AUTOSTARTDIR ?= /etc/xdg/autostart
MANDIR  ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share
DOCDIR  ?= $(DATADIR)/doc/gpuctl
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DBUSPOLICYDIR ?= $(DATADIR)/dbus-1/system.d
CARGO   ?= cargo
TARGET  := x86_64-unknown-linux-gnu
STATIC_BIN := target/$(TARGET)/release/gpuctl
CLANG_FORMAT ?= clang-format
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n1)
CARGOFLAGS ?= --locked
TEST_THREADS ?= 4
STATIC ?= 1
TRAY   ?= 1
STRIP  ?= 1
CARGO_HOME ?= $(HOME)/.cargo
DISTDIR ?= target/dist
# The user documentation installed beside README.md, at the same relative paths (so the
# README's links work in DOCDIR).
USER_DOCS := docs/USAGE.md docs/SECURITY.md docs/PROTOCOL.md docs/images/tray-waybar-hybrid.png \
	docs/images/tray-waybar-integrated.png
# No build path in the binary: Rust sources, C sources (libbpf) and the BPF object's BTF.
SRC_PREFIX := /usr/src/gpuctl-$(VERSION)
REMAP := --remap-path-prefix=$(CURDIR)=$(SRC_PREFIX) --remap-path-prefix=$(CARGO_HOME)=/cargo
C_REMAP := -ffile-prefix-map=$(CURDIR)=$(SRC_PREFIX) -ffile-prefix-map=$(CARGO_HOME)=/cargo
STATIC_RUSTFLAGS := $(if $(filter 1,$(STATIC)),-C target-feature=+crt-static)
# The cargo features (default: static, tray), spelt out so STATIC=0 keeps the tray.
STATIC_FEATURES := --no-default-features $(if $(filter 1,$(STATIC)),--features static) \
	$(if $(filter 1,$(TRAY)),--features tray)
RELEASE_ENV := RUSTFLAGS="$(strip $(RUSTFLAGS) $(STATIC_RUSTFLAGS) $(REMAP))" \
	LIBBPF_SYS_EXTRA_CFLAGS="$(strip $(LIBBPF_SYS_EXTRA_CFLAGS) $(C_REMAP))" \
	BPF_CFLAGS="$(strip $(BPF_CFLAGS) $(C_REMAP))" \
	CARGO_PROFILE_RELEASE_STRIP=$(if $(filter 1,$(STRIP)),true,false) \
	CARGO_PROFILE_RELEASE_DEBUG=$(if $(filter 1,$(STRIP)),false,line-tables-only)

APT_PACKAGES := clang llvm libelf-dev zlib1g-dev pkg-config clang-format \
	qemu-system-x86 busybox-static kmod cpio xz-utils binutils shellcheck file gcc libc6-dev \
	bubblewrap libdrm-dev strace \
	acpica-tools \
	debhelper dpkg-dev fakeroot lintian cargo-web rpm rpmlint makepkg pacman-package-manager \
	libarchive-tools debootstrap e2fsprogs groff-base \
	dbus sway waybar grim desktop-file-utils \
	switcheroo-control python3-gi gir1.2-glib-2.0

.PHONY: all deps build static check test test-install test-unit test-root test-vm test-distro lint fmt demo bench bench-vm-lsm install install-files uninstall dist clean

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
	$(RELEASE_ENV) $(CARGO) build $(CARGOFLAGS) $(STATIC_FEATURES) --release --target $(TARGET)
	@file $(STATIC_BIN) 2>/dev/null || true
	@ls -l $(STATIC_BIN)

# Root tests carry #[ignore = "root"]: as root every test runs (--include-ignored);
# otherwise the root tests are reported as ignored.
test: static test-install
	@if [ "$$(id -u)" = 0 ]; then \
		echo "$(CARGO) test --locked -- --include-ignored --test-threads=$(TEST_THREADS)"; \
		$(CARGO) test --locked -- --include-ignored --test-threads=$(TEST_THREADS); \
	else $(CARGO) test --locked -- --test-threads=$(TEST_THREADS) && \
		echo "test-root: SKIPPED (needs root; the root tests are reported as ignored above)" >&2; fi
	@if [ ! -d tests/vm ]; then :; elif [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-vm; \
	else echo "test-vm: SKIPPED (make test runs it as root only, as CI does)" >&2; fi
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-distro; \
	else echo "test-distro: SKIPPED (needs root: debootstrap, chroot, package builds)" >&2; fi

# `make install` into a scratch DESTDIR lays out every file a package ships.
test-install:
	@d=$$(mktemp -d) && $(MAKE) --no-print-directory install DESTDIR=$$d PREFIX=/usr >/dev/null && \
	for f in usr/bin/gpuctl usr/lib/systemd/system/gpuctl.service usr/share/doc/gpuctl/examples/gpuctl.toml \
		usr/lib/sysusers.d/gpuctl.conf usr/share/man/man1/gpuctl.1 usr/share/bash-completion/completions/gpuctl \
		usr/share/zsh/site-functions/_gpuctl usr/share/fish/vendor_completions.d/gpuctl.fish \
		usr/lib/systemd/user/gpuctl-tray.service etc/xdg/autostart/gpuctl-tray.desktop \
		usr/lib/systemd/system/gpuctl-switcheroo.service \
		usr/share/dbus-1/system.d/net.hadess.SwitcherooControl-gpuctl.conf \
		usr/share/doc/gpuctl/README.md $(addprefix usr/share/doc/gpuctl/,$(USER_DOCS)); do \
		test -s $$d/$$f || { echo "make install did not install $$f"; exit 1; }; done && \
	grep -q '^ExecStart=/usr/bin/gpuctl daemon' $$d/usr/lib/systemd/system/gpuctl.service && \
	grep -q '^ExecStart=/usr/bin/gpuctl tray$$' $$d/usr/lib/systemd/user/gpuctl-tray.service && \
	grep -q '^Exec=/usr/bin/gpuctl tray$$' $$d/etc/xdg/autostart/gpuctl-tray.desktop && \
	grep -q '^ExecStart=/usr/bin/gpuctl switcheroo$$' $$d/usr/lib/systemd/system/gpuctl-switcheroo.service && \
	if command -v desktop-file-validate >/dev/null; then \
		desktop-file-validate $$d/etc/xdg/autostart/gpuctl-tray.desktop; fi && \
	file $$d/usr/bin/gpuctl | grep -q 'static-pie linked' && \
	! test -e $$d/etc/gpuctl && \
	if strings $$d/usr/bin/gpuctl | grep -F -e "$(CURDIR)" -e "$(CARGO_HOME)"; then \
		echo "make install: the binary embeds build paths (above)"; exit 1; fi && \
	if command -v systemd-analyze >/dev/null; then \
		sed "s|/usr/bin/gpuctl|$$d/usr/bin/gpuctl|" $$d/usr/lib/systemd/system/gpuctl.service \
			> $$d/gpuctl.service && systemd-analyze verify --man=no $$d/gpuctl.service && \
		sed "s|/usr/bin/gpuctl|$$d/usr/bin/gpuctl|" $$d/usr/lib/systemd/system/gpuctl-switcheroo.service \
			> $$d/gpuctl-switcheroo.service && \
		systemd-analyze verify --man=no $$d/gpuctl-switcheroo.service; \
	else echo "systemd-analyze not found: unit not verified"; fi && \
	echo "install: 1 passed, 0 failed" && rm -rf $$d

# The inner loop (under 2 minutes warm, HACKING.md): no root, no release build.
check:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	@$(MAKE) --no-print-directory test-unit

test-unit:
	$(CARGO) test --locked -- --test-threads=$(TEST_THREADS)

test-root:
	@if [ "$$(id -u)" != 0 ]; then \
		echo "make test-root: needs root (BPF programs, mknod, cgroups); see HACKING.md" >&2; exit 1; fi
	$(CARGO) test --locked -- --ignored --test-threads=$(TEST_THREADS)

test-vm: static
	tests/vm/guest-tests.sh $(STATIC_BIN)
	tests/vm/auto-tests.sh $(STATIC_BIN)
	tests/vm/power-tests.sh $(STATIC_BIN)
	tests/vm/poweroff-tests.sh $(STATIC_BIN)

# Distribution packages built as distros do (offline, from `make dist`), linted, and the
# .deb installed in a debootstrapped Debian 12 booted with systemd in QEMU (tests/distro).
test-distro: dist
	tests/distro/run.sh $(DISTDIR)/gpuctl-$(VERSION).tar.gz

dist:
	packaging/mkdist.sh $(DISTDIR)

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(CARGO) clippy --locked --bins --no-default-features --features static -- -D warnings
	$(CLANG_FORMAT) --dry-run --Werror bpf/*.c bpf/*.h bench/*.c tests/vm/*.c
	shellcheck -x .ci/run tests/*.sh tests/vm/*.sh $(wildcard bench/*.sh bench/*/*.sh) packaging/*.sh \
		$(wildcard tests/distro/*.sh tests/distro/guest/*)

fmt:
	$(CARGO) fmt
	$(CLANG_FORMAT) -i bpf/*.c bpf/*.h bench/*.c tests/vm/*.c

demo: build
	$(CARGO) build $(CARGOFLAGS) --example fixture
	tests/demo.sh target/debug/gpuctl target/debug/examples/fixture

bench: static
	$(CARGO) build $(CARGOFLAGS) --example bench
	target/debug/examples/bench $(STATIC_BIN)

# The lsm backend's per-program cost, in the QEMU tier (TCG: ratios only).
bench-vm-lsm: static
	bench/vm-lsm.sh $(STATIC_BIN)

install: static install-files

# Installs what `make static` built (packagers: after the build, same variables).
install-files:
	install -D -m 0755 $(STATIC_BIN) $(DESTDIR)$(BINDIR)/gpuctl
	install -D -m 0644 packaging/systemd/gpuctl.service $(DESTDIR)$(UNITDIR)/gpuctl.service
	sed -i 's|/usr/bin/gpuctl|$(BINDIR)/gpuctl|' $(DESTDIR)$(UNITDIR)/gpuctl.service
	install -D -m 0644 packaging/sysusers.d/gpuctl.conf $(DESTDIR)$(SYSUSERSDIR)/gpuctl.conf
	install -D -m 0644 packaging/gpuctl.toml $(DESTDIR)$(DOCDIR)/examples/gpuctl.toml
	install -D -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	for f in $(USER_DOCS); do install -D -m 0644 $$f $(DESTDIR)$(DOCDIR)/$$f || exit 1; done
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DATADIR)/bash-completion/completions \
		$(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	$(STATIC_BIN) manpage > $(DESTDIR)$(MANDIR)/man1/gpuctl.1
	$(STATIC_BIN) completions bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/gpuctl
	$(STATIC_BIN) completions zsh > $(DESTDIR)$(DATADIR)/zsh/site-functions/_gpuctl
	$(STATIC_BIN) completions fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/gpuctl.fish
ifeq ($(TRAY),1)
	install -D -m 0644 packaging/systemd/gpuctl-tray.service $(DESTDIR)$(USERUNITDIR)/gpuctl-tray.service
	sed -i 's|/usr/bin/gpuctl|$(BINDIR)/gpuctl|' $(DESTDIR)$(USERUNITDIR)/gpuctl-tray.service
	install -D -m 0644 packaging/desktop/gpuctl-tray.desktop $(DESTDIR)$(AUTOSTARTDIR)/gpuctl-tray.desktop
	sed -i 's|^Exec=gpuctl|Exec=$(BINDIR)/gpuctl|' $(DESTDIR)$(AUTOSTARTDIR)/gpuctl-tray.desktop
	install -D -m 0644 packaging/systemd/gpuctl-switcheroo.service $(DESTDIR)$(UNITDIR)/gpuctl-switcheroo.service
	sed -i 's|/usr/bin/gpuctl|$(BINDIR)/gpuctl|' $(DESTDIR)$(UNITDIR)/gpuctl-switcheroo.service
	install -D -m 0644 packaging/dbus/net.hadess.SwitcherooControl-gpuctl.conf \
		$(DESTDIR)$(DBUSPOLICYDIR)/net.hadess.SwitcherooControl-gpuctl.conf
endif
	@# A source install on a running system: create the group now (packages do it themselves).
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null; then \
		systemd-sysusers $(SYSUSERSDIR)/gpuctl.conf; fi

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/gpuctl $(DESTDIR)$(UNITDIR)/gpuctl.service \
		$(DESTDIR)$(SYSUSERSDIR)/gpuctl.conf $(DESTDIR)$(DOCDIR)/examples/gpuctl.toml \
		$(DESTDIR)$(DOCDIR)/README.md $(addprefix $(DESTDIR)$(DOCDIR)/,$(USER_DOCS)) \
		$(DESTDIR)$(MANDIR)/man1/gpuctl.1 \
		$(DESTDIR)$(DATADIR)/bash-completion/completions/gpuctl \
		$(DESTDIR)$(DATADIR)/zsh/site-functions/_gpuctl \
		$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/gpuctl.fish \
		$(DESTDIR)$(USERUNITDIR)/gpuctl-tray.service \
		$(DESTDIR)$(AUTOSTARTDIR)/gpuctl-tray.desktop \
		$(DESTDIR)$(UNITDIR)/gpuctl-switcheroo.service \
		$(DESTDIR)$(DBUSPOLICYDIR)/net.hadess.SwitcherooControl-gpuctl.conf

clean:
	$(CARGO) clean
	rm -rf .cache/vm/initramfs-*

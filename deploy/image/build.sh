#!/usr/bin/env bash
# Build the job VMs' guest image from Debian packages and the project's wheels.
#
#   deploy/image/build.sh [OUT]      (make image; OUT defaults to build/image)
#
# Writes OUT/cosmicac-guest.qcow2 (a GPT disk: an EFI system partition with
# systemd-boot, the kernel and the initrd; an ext4 root labelled cosmicac-root),
# and beside it vmlinuz and initrd.img (the qemu backend boots kernel-first) and
# image.json (what went in). Three layers, each cached under OUT and rebuilt only
# when its inputs change (deploy/image/README.md):
#   base-<hash>.tar    mmdebstrap of packages.txt      (minutes; the packages' list)
#   wheels-<hash>/     pip wheels of the project + deps (the project's files)
#   the disk           assembled from both              (about a minute)
# Needs root (the root file system keeps its owners and device nodes), mmdebstrap,
# e2fsprogs, dosfstools, mtools, fdisk and qemu-utils: `bash .ci/run deps`.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="$(mkdir -p "${1:-$REPO/build/image}" && cd "${1:-$REPO/build/image}" && pwd)"
SUITE="${IMAGE_SUITE:-bookworm}"
MIRROR="${IMAGE_MIRROR:-http://deb.debian.org/debian}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
ROOT_LABEL=cosmicac-root
ESP_MIB=128
# Free room in the root file system beyond its content; the VM's disk may be larger
# still: cloud-init's growpart and resize_rootfs grow the partition to the disk.
ROOT_FREE_MIB=768

step() { printf 'image: %s\n' "$*" >&2; }
fail() { printf 'image: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || fail "run as root: the root file system keeps owners and device nodes"
for tool in mmdebstrap mke2fs mkfs.vfat mcopy mmd sfdisk qemu-img; do
    command -v "$tool" >/dev/null || fail "$tool is missing (bash .ci/run deps installs it)"
done
[[ -x $PYTHON ]] || fail "no Python at $PYTHON (make install creates .venv)"

hash_of() { sha256sum | cut -c1-16; }

# -- 1. the Debian base ---------------------------------------------------------
packages="$(grep -v '^\s*#' "$HERE/packages.txt" | grep -v '^\s*$' | sort | paste -sd, -)"
base_key="$( { echo "$SUITE $MIRROR"; echo "$packages"; echo v1; } | hash_of)"
base="$OUT/base-$base_key.tar"
if [[ -f $base ]]; then
    step "1/4 Debian base $SUITE: cached ($(basename "$base"))"
else
    step "1/4 Debian base $SUITE: mmdebstrap of $(tr , '\n' <<<"$packages" | wc -l) packages from $MIRROR"
    rm -f "$OUT"/base-*.tar
    mmdebstrap --variant=minbase --format=tar --components=main --include="$packages" \
        --aptopt='Acquire::Retries "3"' \
        --customize-hook='chroot "$1" apt-get clean' \
        "$SUITE" "$base.partial" "$MIRROR" >&2
    mv "$base.partial" "$base"
fi

# -- 2. the project's wheels ----------------------------------------------------
# Keyed by every file git knows in the project's packages (committed or not), so a
# change to the code rebuilds the wheels and the disk, and nothing else does.
wheels_key="$(cd "$REPO" && { echo v3; git ls-files -co --exclude-standard -- pyproject.toml \
    p2p cli relay crdt contracts runtime nodes agents | LC_ALL=C sort \
    | xargs -d '\n' sha256sum 2>/dev/null; } | hash_of)"
wheels="$OUT/wheels-$wheels_key"
if [[ -d $wheels ]]; then
    step "2/4 wheels: cached ($(basename "$wheels"))"
else
    step "2/4 wheels: the project and its dependencies (pip wheel)"
    rm -rf "$OUT"/wheels-*
    # setuptools stages an in-tree build in build/lib and never empties it: a module
    # deleted from the source would still ship in the wheel.
    rm -rf "$REPO/build/lib" "$REPO"/build/bdist.*
    # Plus what the guest's Python (Debian's 3.11.2) needs and a newer host's does
    # not: redis asks for async-timeout below 3.11.3. The guest installs offline.
    "$PYTHON" -m pip wheel --quiet --wheel-dir "$wheels.partial" "$REPO" \
        'async-timeout>=4.0.3' >&2 \
        || fail "pip wheel failed (above: what pip said)"
    mv "$wheels.partial" "$wheels"
fi

disk="$OUT/cosmicac-guest.qcow2"
disk_key="$( { echo "$base_key $wheels_key $ROOT_LABEL $ESP_MIB $ROOT_FREE_MIB";
               cat "$HERE/build.sh"; find "$HERE/files" -type f | LC_ALL=C sort \
                   | xargs -d '\n' cat; } | hash_of)"
if [[ -f $disk && -f $OUT/image.json ]] && grep -q "\"key\": \"$disk_key\"" "$OUT/image.json"; then
    step "3/4 root file system: cached"
    step "4/4 disk: cached ($disk)"
    exit 0
fi

# -- 3. the root file system ----------------------------------------------------
work="$OUT/work"
rm -rf "$work" && mkdir -p "$work/rootfs"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
step "3/4 root file system: unpack the base, install cosmicac into /opt/cosmicac"
tar -xf "$base" -C "$rootfs"
cp -r "$wheels" "$rootfs/tmp/wheels"
chroot "$rootfs" python3 -m venv /opt/cosmicac
chroot "$rootfs" /opt/cosmicac/bin/pip install --quiet --no-index --no-compile \
    --find-links /tmp/wheels cosmicac >&2
# Byte-compile once here: the agent's first start in every VM would do it otherwise.
chroot "$rootfs" /opt/cosmicac/bin/python -m compileall -q -j 0 /opt/cosmicac >/dev/null || true
rm -rf "$rootfs/tmp/wheels"
ln -sf /opt/cosmicac/bin/cosmicac "$rootfs/usr/local/bin/cosmicac"
cp -r "$HERE/files/." "$rootfs/"
chroot "$rootfs" systemctl enable systemd-networkd.service >/dev/null 2>&1
# Every VM gets its own machine id (systemd makes one at first boot) and host name
# (cloud-init's local-hostname).
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/var/lib/dbus/machine-id" "$rootfs/etc/hostname"
kernel="$(cd "$rootfs/boot" && ls vmlinuz-* | sort -V | tail -1)"
initrd="initrd.img-${kernel#vmlinuz-}"
[[ -f $rootfs/boot/$initrd ]] || fail "the kernel package made no initrd ($initrd)"
install -m 0644 "$rootfs/boot/$kernel" "$work/vmlinuz"
install -m 0644 "$rootfs/boot/$initrd" "$work/initrd.img"
# The last console= is /dev/console, where systemd and the services it starts with
# StandardOutput=…+console write: the serial port, which QEMU keeps in a file and
# KubeVirt shows (virtctl console). The kernel prints on both.
# net.ifnames=0: the NICs are eth0 (the pod network, or user-mode) and eth1 (the
# overlay of a multi-node job: kubevirt.overlay_interface), as KubeVirt's docs name them.
cmdline="root=LABEL=$ROOT_LABEL rw net.ifnames=0 console=tty0 console=ttyS0,115200"

# -- 4. the disk: GPT, an EFI system partition, the root ------------------------
step "4/4 disk: EFI system partition, ext4 root, qcow2"
esp="$work/esp.img"
mkfs.vfat -n COSMICAC -C "$esp" $((ESP_MIB * 1024)) >/dev/null
mmd -i "$esp" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries
mcopy -i "$esp" "$rootfs/usr/lib/systemd/boot/efi/systemd-bootx64.efi" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$esp" "$work/vmlinuz" ::/vmlinuz
mcopy -i "$esp" "$work/initrd.img" ::/initrd.img
printf 'default cosmicac.conf\ntimeout 0\n' >"$work/loader.conf"
printf 'title CosmicAC guest\nlinux /vmlinuz\ninitrd /initrd.img\noptions %s\n' \
    "$cmdline" >"$work/cosmicac.conf"
mcopy -i "$esp" "$work/loader.conf" ::/loader/loader.conf
mcopy -i "$esp" "$work/cosmicac.conf" ::/loader/entries/cosmicac.conf

used_mib=$(( $(du -sm --apparent-size "$rootfs" | cut -f1) * 11 / 10 ))
root_mib=$(( used_mib + ROOT_FREE_MIB ))
root="$work/root.img"
mke2fs -q -t ext4 -L "$ROOT_LABEL" -d "$rootfs" "$root" "${root_mib}M"

raw="$work/disk.raw"
total_mib=$(( 1 + ESP_MIB + root_mib + 1 ))
truncate -s "${total_mib}M" "$raw"
sfdisk --quiet "$raw" <<EOF
label: gpt
start=1MiB, size=${ESP_MIB}MiB, type=uefi, name=esp
start=$((1 + ESP_MIB))MiB, size=${root_mib}MiB, type=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709, name=root
EOF
dd if="$esp" of="$raw" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$root" of="$raw" bs=1M seek=$((1 + ESP_MIB)) conv=notrunc,sparse status=none
qemu-img convert -O qcow2 "$raw" "$disk.partial"
mv "$disk.partial" "$disk"
install -m 0644 "$work/vmlinuz" "$OUT/vmlinuz"
install -m 0644 "$work/initrd.img" "$OUT/initrd.img"
version="$(chroot "$rootfs" /opt/cosmicac/bin/python -c \
    'import importlib.metadata as m; print(m.version("cosmicac"))')"
cat >"$OUT/image.json" <<EOF
{
  "key": "$disk_key",
  "suite": "$SUITE",
  "kernel": "${kernel#vmlinuz-}",
  "cmdline": "$cmdline",
  "cosmicac": "$version",
  "base": "$(basename "$base")",
  "wheels": "$(basename "$wheels")",
  "root_label": "$ROOT_LABEL",
  "virtual_size_mib": $total_mib
}
EOF
step "done: $disk ($(du -m "$disk" | cut -f1) MiB on disk, ${total_mib} MiB virtual)"

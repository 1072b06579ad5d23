#!/bin/bash
# Adapted from the team's lab scripts; see e2e/qemu/README.md.
# Turn a debootstrap'ed bookworm rootfs into a bootable QEMU test guest.
# Usage: configure-guest-rootfs.sh ROOTFS SSH_PUBKEY_FILE
set -euo pipefail
R=$1; PUB=$2
# keep the downloaded .debs out of the image
rm -f $R/var/cache/apt/archives/*.deb
echo e2e-guest > $R/etc/hostname
printf '127.0.0.1 localhost\n127.0.1.1 e2e-guest\n::1 localhost ip6-localhost ip6-loopback\n' > $R/etc/hosts
echo '/dev/vda / ext4 defaults,discard 0 1' > $R/etc/fstab
chroot $R passwd -d root >/dev/null
# serial console autologin (ttyS0) -> "type commands over the serial port" fallback
mkdir -p $R/etc/systemd/system/serial-getty@ttyS0.service.d
cat > $R/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf <<'U'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear --keep-baud 115200,57600,38400,9600 %I $TERM
U
# networking via systemd-networkd + DHCP from QEMU slirp (10.0.2.15/24, gw 10.0.2.2)
cat > $R/etc/systemd/network/10-wired.network <<'U'
[Match]
Name=en* eth*
[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
U
ln -sf /lib/systemd/system/systemd-networkd.service $R/etc/systemd/system/multi-user.target.wants/systemd-networkd.service
mkdir -p $R/etc/systemd/system/sockets.target.wants $R/etc/systemd/system/network-online.target.wants
ln -sf /lib/systemd/system/systemd-networkd.socket $R/etc/systemd/system/sockets.target.wants/systemd-networkd.socket
ln -sf /lib/systemd/system/systemd-networkd-wait-online.service $R/etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service
# no background timers / network chatter in tests
for t in apt-daily-upgrade.timer apt-daily.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do
  rm -f $R/etc/systemd/system/timers.target.wants/$t
done
rm -f $R/etc/systemd/system/multi-user.target.wants/e2scrub_reap.service
# ssh: key-only root login
mkdir -p -m700 $R/root/.ssh; install -m600 $PUB $R/root/.ssh/authorized_keys
echo 'PermitRootLogin prohibit-password' > $R/etc/ssh/sshd_config.d/e2e.conf
echo 'UseDNS no' >> $R/etc/ssh/sshd_config.d/e2e.conf
# readiness marker on the serial console once ssh+containerd are up
cat > $R/etc/systemd/system/e2e-ready.service <<'U'
[Unit]
Description=Print readiness marker on ttyS0
After=multi-user.target containerd.service ssh.service systemd-networkd-wait-online.service
Wants=containerd.service ssh.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "E2E-READY uptime=$(cut -d" " -f1 /proc/uptime)" > /dev/ttyS0'
[Install]
WantedBy=multi-user.target
U
ln -sf /etc/systemd/system/e2e-ready.service $R/etc/systemd/system/multi-user.target.wants/e2e-ready.service
# smaller, faster initramfs: only the modules needed to mount a virtio-blk ext4 root
cat > $R/etc/initramfs-tools/modules <<'U'
virtio_pci
virtio_blk
virtio_net
virtio_console
ext4
U
sed -i 's/^MODULES=.*/MODULES=list/' $R/etc/initramfs-tools/initramfs.conf
chroot $R update-initramfs -u -k all >/dev/null 2>&1
# machine-id: empty file -> generated at first boot (keeps images identical)
: > $R/etc/machine-id

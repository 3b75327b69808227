//go:build linux

package podnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/testutil"
)

// vnetHdrLen is the size of the virtio-net header a tap with IFF_VNET_HDR puts before each frame.
const vnetHdrLen = 10

// podNamespaces makes, for one test, a pod's network namespace holding eth0 (10.77.0.2/24, a route to
// 10.77.1.0/24 via 10.77.0.1) and a peer namespace holding the other end of the veth (10.77.0.1/24), as a
// CNI plugin would; both are removed when the test ends. It returns the pod namespace's path and the peer's
// handle.
func podNamespaces(t *testing.T) (string, netns.NsHandle) {
	t.Helper()
	testutil.RequireRoot(t, "to make network namespaces")
	dir := t.TempDir()
	for _, n := range []string{"pod", "peer"} {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		// unshare(1) mounts the new namespace on the file, as CNI runtimes pin theirs.
		if out, err := exec.Command("unshare", "--net="+p, "true").CombinedOutput(); err != nil {
			t.Fatalf("unshare: %v: %s", err, out)
		}
		t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	}
	sh := func(ns string, args ...string) {
		t.Helper()
		cmd := exec.Command("nsenter", append([]string{"--net=" + filepath.Join(dir, ns), "--"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	sh("pod", "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
	sh("pod", "ip", "link", "set", "peer0", "netns", filepath.Join(dir, "peer"))
	sh("pod", "ip", "addr", "add", "10.77.0.2/24", "dev", "eth0")
	sh("pod", "ip", "link", "set", "eth0", "up")
	sh("pod", "ip", "route", "add", "10.77.1.0/24", "via", "10.77.0.1", "dev", "eth0")
	sh("peer", "ip", "addr", "add", "10.77.0.1/24", "dev", "peer0")
	sh("peer", "ip", "link", "set", "peer0", "up")
	peer, err := netns.GetFromPath(filepath.Join(dir, "peer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	return filepath.Join(dir, "pod"), peer
}

func TestConnect(t *testing.T) {
	pod, peer := podNamespaces(t)
	l, err := Connect(pod)
	if err != nil {
		t.Fatal(err)
	}
	iface := l.Interface
	if iface.Name != "eth0" || len(iface.Addrs) != 1 || iface.Addrs[0].String() != "10.77.0.2/24" || len(iface.MAC) != 6 {
		t.Fatalf("interface: %+v", iface)
	}
	if len(iface.Routes) != 1 || iface.Routes[0].Dst.String() != "10.77.1.0/24" || !iface.Routes[0].Gateway.Equal(net.ParseIP("10.77.0.1")) {
		t.Fatalf("routes: %+v", iface.Routes)
	}

	// What the peer sends to the pod's address arrives on the tap: the peer's ARP request for it, which a
	// datagram to the address sets off (the socket is made on a thread inside the peer's namespace).
	if err := inNamespace(peer, func() error {
		c, err := net.Dial("udp4", "10.77.0.2:9")
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		_, err = c.Write([]byte("to the pod"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	frame := readFrame(t, l.Tap, func(f []byte) bool { return etherType(f) == unix.ETH_P_ARP })
	if got := net.IP(frame[14+24 : 14+28]); !got.Equal(net.ParseIP("10.77.0.2")) {
		t.Fatalf("ARP frame on the tap asks for %s, want 10.77.0.2", got)
	}

	// What the VM writes to the tap leaves through eth0 to the peer: a frame of an experimental ethertype,
	// caught by a packet socket on the peer's end.
	const experimental = 0x88b5
	catch := packetSocket(t, peer, experimental)
	out := make([]byte, vnetHdrLen+60)
	f := out[vnetHdrLen:]
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], iface.MAC)
	binary.BigEndian.PutUint16(f[12:14], experimental)
	copy(f[14:], "from the guest")
	if _, err := l.Tap.Write(out); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	n, err := catch.Read(buf)
	if err != nil {
		t.Fatalf("the frame written to the tap never reached the peer: %v", err)
	}
	if !strings.HasPrefix(string(buf[14:n]), "from the guest") {
		t.Fatalf("the peer got %q", buf[:n])
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The namespace is as the CNI plugin left it: no tap, no ingress qdisc on eth0.
	ns, err := netns.GetFromPath(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	_ = inNamespace(ns, func() error {
		if _, err := netlink.LinkByName(TapName); err == nil {
			t.Error("the tap outlived Close")
		}
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		qs, err := netlink.QdiscList(link)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Type() == "ingress" {
				t.Error("eth0 keeps its ingress qdisc after Close")
			}
		}
		return nil
	})
}

func TestConnectNoInterface(t *testing.T) {
	testutil.RequireRoot(t, "to make network namespaces")
	p := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "--net="+p, "true").CombinedOutput(); err != nil {
		t.Fatalf("unshare: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	if _, err := Connect(p); !errors.Is(err, ErrNoInterface) {
		t.Fatalf("Connect of a namespace with only lo: %v, want ErrNoInterface", err)
	}
	if _, err := Connect(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Connect of a missing namespace: %v", err)
	}
}

func TestGuestCommands(t *testing.T) {
	_, dst, _ := net.ParseCIDR("10.77.1.0/24")
	_, addr, _ := net.ParseCIDR("10.77.0.0/24")
	addr.IP = net.ParseIP("10.77.0.2").To4()
	iface := Interface{Name: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, MTU: 1500, Addrs: []*net.IPNet{addr},
		Routes: []Route{{Dst: dst, Gateway: net.ParseIP("10.77.0.1")}, {Gateway: net.ParseIP("10.77.0.1")}}}
	var got []string
	for _, c := range iface.GuestCommands("eth0") {
		got = append(got, strings.Join(c, " "))
	}
	want := []string{
		"ip link set eth0 address 02:00:00:00:00:01 mtu 1500",
		"ip link set lo up",
		"ip link set eth0 up",
		"ip addr add 10.77.0.2/24 dev eth0",
		"ip route add 10.77.1.0/24 via 10.77.0.1 dev eth0",
		"ip route add default via 10.77.0.1 dev eth0",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// readFrame reads frames from the tap (non-blocking, as the tap's file is) until one satisfies match, and
// returns it without its virtio-net header.
func readFrame(t *testing.T, tap *os.File, match func([]byte) bool) []byte {
	t.Helper()
	if err := tap.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	for {
		n, err := tap.Read(buf)
		if err != nil {
			t.Fatalf("reading the tap: %v", err)
		}
		if f := buf[vnetHdrLen:n]; len(f) >= 14+28 && match(f) {
			return append([]byte(nil), f...)
		}
	}
}

func etherType(f []byte) uint16 { return binary.BigEndian.Uint16(f[12:14]) }

// packetSocket opens, in the peer's namespace, a packet socket on peer0 for frames of ethertype proto,
// whose reads time out after 30 s.
func packetSocket(t *testing.T, peer netns.NsHandle, proto uint16) *os.File {
	t.Helper()
	var f *os.File
	if err := inNamespace(peer, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
		if err != nil {
			return err
		}
		f = os.NewFile(uintptr(fd), "packet")
		link, err := netlink.LinkByName("peer0")
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: link.Attrs().Index})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	tv := unix.NsecToTimeval((30 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(int(f.Fd()), unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return f
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

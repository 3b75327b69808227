//go:build linux

// Package podnet gives a microVM its pod's network. In the pod's network namespace, which the CNI plugin
// set up for the sandbox, it makes a tap device for the VM and redirects every frame between the CNI's
// interface and the tap in both directions with tc (an ingress qdisc and a u32 match-all filter whose
// action is mirred egress redirect, on each side). The guest's NIC then carries the interface's MAC and
// addresses, so the pod's IP answers from inside the VM, and nothing in the namespace's own IP stack sees
// the traffic. What the guest must configure is described by Interface.
package podnet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TapName is the name of the tap device Connect makes in the pod's namespace.
const TapName = "tap0_crust"

// Route is a route of the pod's interface, for the guest to add on its NIC.
type Route struct {
	// Dst is the destination; nil is the default route.
	Dst *net.IPNet
	// Gateway is the next hop; nil for a directly connected destination.
	Gateway net.IP
}

// Interface is the pod interface the guest takes over.
type Interface struct {
	// Name is the interface's name in the pod's namespace (eth0 as CNI plugins name it).
	Name string
	// MAC is its hardware address, which the guest's NIC is given.
	MAC net.HardwareAddr
	// MTU is its MTU.
	MTU int
	// Addrs are its global unicast addresses with their prefixes.
	Addrs []*net.IPNet
	// Routes are its routes from the main table, other than those the kernel adds for Addrs.
	Routes []Route
}

// Link is the pod's network connected to a tap device, until Close.
type Link struct {
	// Interface is what the guest must configure on its NIC.
	Interface Interface
	// Tap is the tap device's file (IFF_TAP, IFF_NO_PI, IFF_VNET_HDR), to hand to QEMU as its netdev's fd.
	Tap *os.File

	ns   netns.NsHandle
	veth int // the pod interface's index
}

// Connect finds the pod's interface in the network namespace at nsPath (the one non-loopback interface
// with a global unicast address; ErrNoInterface when there is none, an error naming them when there are
// several), makes the tap, and redirects traffic between them. The caller hands Link.Tap to the VM and
// closes the Link when the VM is gone.
func Connect(nsPath string) (*Link, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("podnet: network namespace %s: %w", nsPath, err)
	}
	var l *Link
	err = inNamespace(ns, func() error {
		var err error
		l, err = connect()
		return err
	})
	if err != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("podnet: network namespace %s: %w", nsPath, err)
	}
	l.ns = ns
	return l, nil
}

// ErrNoInterface is returned by Connect for a namespace with no interface to take over (a host-network
// pod's, or one the CNI plugin has not configured).
var ErrNoInterface = errors.New("no interface with a global unicast address")

// inNamespace runs fn on a thread in ns, and puts the thread back in its own namespace after; a thread that
// cannot be put back is never used again.
func inNamespace(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer func() { _ = orig.Close() }()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread() // back in its own namespace: fit for other goroutines again
		}
		errc <- err
	}()
	return <-errc
}

// connect does Connect's work on a thread inside the pod's namespace.
func connect() (*Link, error) {
	iface, veth, err := findInterface()
	if err != nil {
		return nil, err
	}
	tap := &netlink.Tuntap{
		LinkAttrs:  netlink.LinkAttrs{Name: TapName, MTU: iface.MTU},
		Mode:       netlink.TUNTAP_MODE_TAP,
		Flags:      netlink.TUNTAP_DEFAULTS | netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
		NonPersist: true, // the device goes when its file is closed: it cannot outlive the VM's holder
		Queues:     1,
	}
	if err := netlink.LinkAdd(tap); err != nil {
		return nil, fmt.Errorf("tap %s: %w", TapName, err)
	}
	l := &Link{Interface: iface, Tap: tap.Fds[0], veth: veth.Attrs().Index}
	fail := func(err error) (*Link, error) {
		_ = l.Tap.Close()
		_ = netlink.QdiscDel(ingress(l.veth))
		return nil, err
	}
	if err := netlink.LinkSetUp(tap); err != nil {
		return fail(fmt.Errorf("tap %s up: %w", TapName, err))
	}
	if err := redirect(l.veth, tap.Attrs().Index); err != nil {
		return fail(fmt.Errorf("%s to %s: %w", iface.Name, TapName, err))
	}
	if err := redirect(tap.Attrs().Index, l.veth); err != nil {
		return fail(fmt.Errorf("%s to %s: %w", TapName, iface.Name, err))
	}
	return l, nil
}

// findInterface finds the pod's interface and reads what the guest needs of it.
func findInterface() (Interface, netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return Interface{}, nil, err
	}
	var found []netlink.Link
	var ifaces []Interface
	for _, link := range links {
		a := link.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.Name == TapName {
			continue
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return Interface{}, nil, fmt.Errorf("addresses of %s: %w", a.Name, err)
		}
		iface := Interface{Name: a.Name, MAC: a.HardwareAddr, MTU: a.MTU}
		for _, addr := range addrs {
			if addr.IP.IsGlobalUnicast() {
				iface.Addrs = append(iface.Addrs, addr.IPNet)
			}
		}
		if len(iface.Addrs) == 0 {
			continue
		}
		routes, err := netlink.RouteList(link, netlink.FAMILY_ALL)
		if err != nil {
			return Interface{}, nil, fmt.Errorf("routes of %s: %w", a.Name, err)
		}
		for _, r := range routes {
			if r.Protocol == unix.RTPROT_KERNEL || r.Table != unix.RT_TABLE_MAIN {
				continue // the guest's kernel adds the prefix routes of its addresses itself
			}
			iface.Routes = append(iface.Routes, Route{Dst: r.Dst, Gateway: r.Gw})
		}
		found, ifaces = append(found, link), append(ifaces, iface)
	}
	switch len(found) {
	case 0:
		return Interface{}, nil, ErrNoInterface
	case 1:
		return ifaces[0], found[0], nil
	}
	names := make([]string, len(found))
	for i, l := range found {
		names[i] = l.Attrs().Name
	}
	return Interface{}, nil, fmt.Errorf("several interfaces with addresses (%v): one NIC a VM is supported", names)
}

// ingress is the ingress qdisc of the link with index idx.
func ingress(idx int) *netlink.Ingress {
	return &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
}

// redirect sends every frame arriving at link from out of link to, as if to's own.
func redirect(from, to int) error {
	if err := netlink.QdiscAdd(ingress(from)); err != nil {
		return fmt.Errorf("ingress qdisc: %w", err)
	}
	filter := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: from, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		Actions:     []netlink.Action{netlink.NewMirredAction(to)},
	}
	if err := netlink.FilterAdd(filter); err != nil {
		return fmt.Errorf("redirect filter: %w", err)
	}
	return nil
}

// Close removes the tap (closing its file) and the redirection from the pod's interface, leaving the
// namespace as the CNI plugin made it. A namespace already gone is not an error.
func (l *Link) Close() error {
	err := l.Tap.Close()
	if l.ns.IsOpen() {
		nerr := inNamespace(l.ns, func() error {
			if err := netlink.QdiscDel(ingress(l.veth)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("podnet: ingress qdisc of %s: %w", l.Interface.Name, err)
			}
			return nil
		})
		err = errors.Join(err, nerr, l.ns.Close())
	}
	return err
}

// GuestCommands are the commands (busybox ip) that configure the guest's NIC, named dev, as iface.
func (iface Interface) GuestCommands(dev string) [][]string {
	cmds := [][]string{
		{"ip", "link", "set", dev, "address", iface.MAC.String(), "mtu", fmt.Sprint(iface.MTU)},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "set", dev, "up"},
	}
	for _, a := range iface.Addrs {
		cmds = append(cmds, []string{"ip", "addr", "add", a.String(), "dev", dev})
	}
	for _, r := range iface.Routes {
		dst := "default"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		cmd := []string{"ip", "route", "add", dst}
		if r.Gateway != nil {
			cmd = append(cmd, "via", r.Gateway.String())
		}
		cmds = append(cmds, append(cmd, "dev", dev))
	}
	return cmds
}

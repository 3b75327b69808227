package guest

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// Superblock fields read to learn a filesystem's size (from the ext4 and XFS on-disk formats).
const (
	extSuperOffset   = 1024   // the ext2/3/4 superblock's place on the disk
	extMagic         = 0xEF53 // s_magic, at 0x38
	extIncompat64Bit = 0x80   // INCOMPAT_64BIT in s_feature_incompat: s_blocks_count_hi is used
	xfsMagic         = 0x58465342
)

// filesystemBytes returns the size the filesystem on dev has as its superblock records it (blocks count
// times block size) and its block size, for ext2/3/4 and XFS; fsType says which to read. A superblock
// that is not fsType's is an error.
func filesystemBytes(dev, fsType string) (size, block uint64, err error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	switch fsType {
	case "ext2", "ext3", "ext4":
		sb := make([]byte, 1024)
		if _, err := f.ReadAt(sb, extSuperOffset); err != nil {
			return 0, 0, fmt.Errorf("read the superblock of %s: %w", dev, err)
		}
		le := binary.LittleEndian
		if le.Uint16(sb[0x38:]) != extMagic {
			return 0, 0, fmt.Errorf("%s holds no %s superblock", dev, fsType)
		}
		logBlock := le.Uint32(sb[0x18:])
		if logBlock > 6 { // 64 KiB blocks at most
			return 0, 0, fmt.Errorf("%s: block size 1024<<%d is not an ext block size", dev, logBlock)
		}
		block = 1024 << logBlock
		blocks := uint64(le.Uint32(sb[0x4:]))
		if le.Uint32(sb[0x60:])&extIncompat64Bit != 0 {
			blocks |= uint64(le.Uint32(sb[0x150:])) << 32
		}
		return blocks * block, block, nil
	case "xfs":
		sb := make([]byte, 16)
		if _, err := io.ReadFull(f, sb); err != nil {
			return 0, 0, fmt.Errorf("read the superblock of %s: %w", dev, err)
		}
		be := binary.BigEndian
		if be.Uint32(sb) != xfsMagic {
			return 0, 0, fmt.Errorf("%s holds no xfs superblock", dev)
		}
		block = uint64(be.Uint32(sb[4:]))
		return be.Uint64(sb[8:]) * block, block, nil
	}
	return 0, 0, fmt.Errorf("the size of a %s filesystem is not known", fsType)
}

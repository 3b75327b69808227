package volume

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"os"
)

// Superblock fields read to learn a filesystem's size (from the ext4 and XFS on-disk formats).
const (
	extSuperOffset   = 1024   // the ext2/3/4 superblock's place on the disk
	extMagic         = 0xEF53 // s_magic, at 0x38
	extIncompat64Bit = 0x80   // INCOMPAT_64BIT in s_feature_incompat: s_blocks_count_hi is used
	xfsMagic         = 0x58465342
)

// FilesystemBytes returns the size the filesystem on the device (or image file) dev has as its
// superblock records it (blocks count times block size), and its block size, for ext2/3/4 and XFS;
// fsType says which to read. It is what tells whether a filesystem already fills a disk that grew
// (compare with the disk's size, allowing one block). A superblock that is not fsType's, and any other
// type, is an error. It only reads.
func FilesystemBytes(dev, fsType string) (size, block uint64, err error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	size, block, err = superblockBytes(f, fsType)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", dev, err)
	}
	return size, block, nil
}

// superblockBytes is FilesystemBytes of disk.
func superblockBytes(disk io.ReaderAt, fsType string) (size, block uint64, err error) {
	switch fsType {
	case "ext2", "ext3", "ext4":
		sb := make([]byte, 1024)
		if _, err := disk.ReadAt(sb, extSuperOffset); err != nil {
			return 0, 0, fmt.Errorf("read the %s superblock: %w", fsType, err)
		}
		le := binary.LittleEndian
		if le.Uint16(sb[0x38:]) != extMagic {
			return 0, 0, fmt.Errorf("no %s superblock", fsType)
		}
		logBlock := le.Uint32(sb[0x18:])
		if logBlock > 6 { // 64 KiB blocks at most
			return 0, 0, fmt.Errorf("block size 1024<<%d is not an ext block size", logBlock)
		}
		block = 1024 << logBlock
		blocks := uint64(le.Uint32(sb[0x4:]))
		if le.Uint32(sb[0x60:])&extIncompat64Bit != 0 {
			blocks |= uint64(le.Uint32(sb[0x150:])) << 32
		}
		return sized(blocks, block)
	case "xfs":
		sb := make([]byte, 16)
		if _, err := disk.ReadAt(sb, 0); err != nil {
			return 0, 0, fmt.Errorf("read the xfs superblock: %w", err)
		}
		be := binary.BigEndian
		if be.Uint32(sb) != xfsMagic {
			return 0, 0, fmt.Errorf("no xfs superblock")
		}
		block = uint64(be.Uint32(sb[4:]))
		if block < 512 || block > 64<<10 || block&(block-1) != 0 {
			return 0, 0, fmt.Errorf("block size %d is not an xfs block size", block)
		}
		return sized(be.Uint64(sb[8:]), block)
	}
	return 0, 0, fmt.Errorf("the size of a %s filesystem is not known", fsType)
}

// sized is blocks of block bytes, refused when it does not fit in 64 bits (no disk is that large).
func sized(blocks, block uint64) (size, blockSize uint64, err error) {
	if hi, size := bits.Mul64(blocks, block); hi == 0 {
		return size, block, nil
	}
	return 0, 0, fmt.Errorf("%d blocks of %d bytes is larger than any disk", blocks, block)
}

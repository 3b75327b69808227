package recordfile

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"time"

	"github.com/sourcegraph/conc/iter"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/safedir"
)

// corruptTimeFormat is the suffix of a file moved into corrupt/.
const corruptTimeFormat = "20060102T150405.000000000Z"

// lockFile is the name, in the directory, of the lock Open takes.
const lockFile = "lock"

// ErrHeld is wrapped by Open's error when another opener holds the directory; the error also wraps
// errdefs.ErrFailedPrecondition and names the directory and the holder.
var ErrHeld = safedir.ErrLocked

// Options say what records a Dir holds and how it is opened.
type Options struct {
	// Version is the newest record format version read (see Encode and Decode), and the one written unless
	// WriteVersion says otherwise.
	Version int
	// WriteVersion is the version Put writes, from the oldest version read to Version; 0 means Version. A
	// user writes an older version than it reads so that the previous release of its program, which reads
	// only that one, can take the records over.
	WriteVersion int
	// OldestVersion is the oldest version read; 0 reads Version alone. Its records are handed to the
	// check with their version, which the user decodes by.
	OldestVersion int
	// Field is the envelope's key for the payload.
	Field string
	// BootID is the running boot's id (see ReadBootID); Put writes it into every record.
	BootID string
	// Records is the name of the subdirectory holding the records, such as "volumes".
	Records string
	// Extra are further subdirectories (mode 0700) the user keeps beside the records; Open creates them.
	Extra []string
	// Holder names the program that opens the directory, such as "crustd": Open writes it into <dir>/lock
	// so that a second opener's refusal names it. It must not be empty.
	Holder string
	// Log receives what Open cleans up and moves aside; nil means slog.Default().
	Log *slog.Logger
}

// Loaded is a valid record file that Open found, handed to the user's check.
type Loaded struct {
	Name string // the file name in the records subdirectory
	Record
}

// Check decides what Open does with a record whose envelope is valid: it returns an error saying what is
// wrong for a record to move aside as damaged (the user's payload does not decode, or the file name does
// not match it), drop=true for a record to delete, and drop=false with a nil error for a record to keep.
// A check keeps what it needs of the records it keeps. Open calls it from several goroutines at once,
// each time for another record.
type Check func(Loaded) (drop bool, err error)

// Report is what Open changed.
type Report struct {
	// Dropped are the file names of the records deleted because the check dropped them, sorted.
	Dropped []string
	// Corrupt are the paths, in <dir>/corrupt, of the files moved aside, sorted.
	Corrupt []string
}

// Dir is an opened directory of records. Put and Delete for one name must be serialised by the caller;
// different names may be used concurrently.
type Dir struct {
	opt          Options
	records, tmp *safedir.Dir
	extra        map[string]*safedir.Dir
	lock         *safedir.Lock
}

// Open opens the record directory dir as the package documentation describes: it takes <dir>/lock for
// opt.Holder, creates the subdirectories, empties tmp/, and classifies every record file, first all of
// them and then acting on the verdicts, so that a record of a newer version fails Open before anything
// is deleted or moved. Close gives the lock up.
//
// Open fails with errdefs.ErrFailedPrecondition, naming the path, when dir or one of its subdirectories is
// a symbolic link or not a directory, when dir is owned by another user or writable by others, when
// another opener holds dir (the error wraps ErrHeld and names the holder), or when a record is of a newer
// format version. It fails on an I/O error reading a record (the record may well be good: moving it aside
// would lose it, and a restart retries). It does not fail because of a damaged record: that is moved into
// corrupt/, logged and reported. It fails with errdefs.ErrInvalidArgument, having changed nothing, on an
// empty boot id or holder or a WriteVersion outside the versions read.
func Open(dir string, opt Options, check Check) (_ *Dir, _ *Report, err error) {
	if opt.BootID == "" || opt.Holder == "" {
		return nil, nil, fmt.Errorf("empty boot id or holder: %w", errdefs.ErrInvalidArgument)
	}
	oldest := cmp.Or(opt.OldestVersion, opt.Version)
	if opt.WriteVersion == 0 {
		opt.WriteVersion = opt.Version
	}
	if opt.WriteVersion < oldest || opt.WriteVersion > opt.Version {
		return nil, nil, fmt.Errorf("write version %d: not one of the versions read, %d to %d: %w",
			opt.WriteVersion, oldest, opt.Version, errdefs.ErrInvalidArgument)
	}
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	d := &Dir{opt: opt, extra: map[string]*safedir.Dir{}}
	root, err := safedir.OpenOwned(dir)
	if err != nil {
		return nil, nil, precondition(err)
	}
	defer func() { _ = root.Close() }() // the subdirectories and the lock stay open
	// The lock first: nothing is created, emptied or moved in a directory another process owns.
	if d.lock, err = root.Lock(lockFile, opt.Holder); err != nil {
		return nil, nil, precondition(err)
	}
	defer func() {
		if err != nil {
			d.lock.Release()
		}
	}()
	names := append([]string{opt.Records, "tmp", "corrupt"}, opt.Extra...)
	subs := make([]*safedir.Dir, len(names))
	for i, name := range names {
		if subs[i], err = root.EnsureDir(name, 0o700); err != nil {
			return nil, nil, precondition(err)
		}
	}
	d.records, d.tmp = subs[0], subs[1]
	corrupt := subs[2]
	defer func() { _ = corrupt.Close() }()
	for i, name := range opt.Extra {
		d.extra[name] = subs[3+i]
	}
	// Make the subdirectories' entries durable before any record is written into them.
	if err := root.Sync(); err != nil {
		return nil, nil, err
	}
	if err := removeContents(d.tmp, log); err != nil {
		return nil, nil, fmt.Errorf("clean %s: %w", d.tmp.Path(), err)
	}
	entries, err := d.records.Names()
	if err != nil {
		return nil, nil, err
	}
	// Every entry is classified before any is acted on; entries are read, verified and checked by as many
	// workers as there are CPUs, each taking the next entry (a start over thousands of records is bound by
	// that work; a goroutine for each would grow a fresh stack for each), and the verdicts are then taken
	// in name order.
	type verdict struct {
		damage string // why the entry is moved aside; "" when it is not
		drop   bool
		err    error // stops Open
	}
	verdicts := make([]verdict, len(entries))
	iter.ForEachIdx(entries, func(i int, name *string) {
		v := &verdicts[i]
		data, err := Read(d.records, *name)
		switch {
		case errors.Is(err, safedir.ErrWrongType), errors.Is(err, safedir.ErrTooLarge):
			// a link, a directory or a huge file: damage, never read through or loaded whole
			v.damage = err.Error()
			return
		case err != nil:
			v.err = fmt.Errorf("read %s: %w", d.records.Join(*name), err)
			return
		}
		rec, err := Decode(data, oldest, opt.Version, opt.Field)
		switch {
		case errors.Is(err, ErrNewerVersion):
			v.err = fmt.Errorf("%s: %w; refusing to load anything so that a downgrade loses nothing: %w",
				d.records.Join(*name), err, errdefs.ErrFailedPrecondition)
			return
		case err != nil:
			v.damage = err.Error()
			return
		}
		drop, err := check(Loaded{Name: *name, Record: rec})
		if err != nil {
			v.damage = err.Error()
		}
		v.drop = drop && err == nil
	})
	type damaged struct{ name, reason string }
	var (
		report Report
		bad    []damaged
	)
	for i, v := range verdicts {
		switch {
		case v.err != nil:
			return nil, nil, v.err
		case v.damage != "":
			bad = append(bad, damaged{entries[i], v.damage})
		case v.drop:
			report.Dropped = append(report.Dropped, entries[i])
		}
	}
	for _, name := range report.Dropped {
		if err := d.records.Remove(name); err != nil {
			return nil, nil, fmt.Errorf("drop record: %w", err)
		}
	}
	now := time.Now().UTC().Format(corruptTimeFormat)
	for _, b := range bad {
		to := b.name + "." + now
		log.Warn("moving a damaged record aside", "file", d.records.Join(b.name), "to", corrupt.Join(to), "reason", b.reason)
		if err := d.records.Rename(b.name, corrupt, to); err != nil {
			return nil, nil, fmt.Errorf("move a damaged record aside: %w", err)
		}
		report.Corrupt = append(report.Corrupt, corrupt.Join(to))
	}
	if len(bad) > 0 {
		if err := corrupt.Sync(); err != nil {
			return nil, nil, err
		}
	}
	if len(bad) > 0 || len(report.Dropped) > 0 {
		if err := d.records.Sync(); err != nil {
			return nil, nil, err
		}
	}
	slices.Sort(report.Dropped)
	slices.Sort(report.Corrupt)
	return d, &report, nil
}

// precondition marks a state directory that may not be worked in (a link, another owner, a loose mode,
// another opener holding it) as a failed precondition: the operator must fix it.
func precondition(err error) error {
	if errors.Is(err, safedir.ErrWrongType) || errors.Is(err, safedir.ErrInsecure) || errors.Is(err, ErrHeld) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	return err
}

// Put stores payload, which must be in the encoding of Options.WriteVersion, as the record name, replacing
// it if there is one. The record is durable when Put
// returns nil; when it returns an error, the stored record is the old one or the new one, and calling Put
// again is safe. A record larger than MaxSize is refused with errdefs.ErrInvalidArgument, so that
// everything Put accepts Open loads.
func (d *Dir) Put(name string, payload []byte) error {
	b, err := Encode(d.opt.WriteVersion, d.opt.BootID, d.opt.Field, payload)
	if err != nil {
		return err
	}
	if len(b) > MaxSize {
		return fmt.Errorf("record is %d bytes, more than %d: %w", len(b), MaxSize, errdefs.ErrInvalidArgument)
	}
	return Write(d.records, d.tmp, name, b)
}

// Delete removes the record name. The removal is durable when Delete returns nil; a missing record is not
// an error.
func (d *Dir) Delete(name string) error {
	if err := d.records.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// Sync even when the file was already gone: an earlier Delete may have unlinked it and then failed to
	// sync, and this call must not report success for a removal that is not yet durable.
	return d.records.Sync()
}

// Extra returns the opened subdirectory name of Options.Extra, or nil.
func (d *Dir) Extra(name string) *safedir.Dir { return d.extra[name] }

// WriteExtra puts data (such as a record Encode made) at name in the subdirectory sub of Options.Extra,
// atomically and durably as Put puts a record (prepared in tmp/, never through a symbolic link, mode
// 0600). Read reads it back. It fails with errdefs.ErrInvalidArgument when sub is not one of
// Options.Extra or data is larger than MaxSize.
func (d *Dir) WriteExtra(sub, name string, data []byte) error {
	dir := d.extra[sub]
	if dir == nil {
		return fmt.Errorf("%q is not a subdirectory this record directory keeps: %w", sub, errdefs.ErrInvalidArgument)
	}
	if len(data) > MaxSize {
		return fmt.Errorf("file is %d bytes, more than %d: %w", len(data), MaxSize, errdefs.ErrInvalidArgument)
	}
	return Write(dir, d.tmp, name, data)
}

// Close gives up the lock Open took, for another process. The subdirectories stay open: a Put
// racing a shutdown fails no worse than before. It is safe to call more than once.
func (d *Dir) Close() { d.lock.Release() }

// removeContents removes everything inside dir, leaving dir itself, never following a link.
func removeContents(dir *safedir.Dir, log *slog.Logger) error {
	names, err := dir.Names()
	if err != nil {
		return err
	}
	for _, name := range names {
		log.Debug("removing a leftover temporary file", "file", dir.Join(name))
		if err := dir.RemoveAll(name); err != nil {
			return err
		}
	}
	return nil
}

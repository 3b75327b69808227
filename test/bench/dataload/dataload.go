// Package dataload is the workload program of the data-path benchmark (test/bench's
// BenchmarkDataPath): the same code runs in the guest, on each path's mount, and on the host, as a
// ceiling. Each workload times itself and prints one Result as JSON, so that what is measured is the
// work alone, not the agent's exec around it.
//
//	dataload create -dir DIR -n N      N files of 4 KiB, each written and fsynced, in DIR (made; 100 a directory)
//	dataload stat -dir DIR             lstat of every entry of the tree at DIR
//	dataload read -dir DIR             read of every regular file of the tree at DIR
//	dataload write -file F -mib M [-direct]   M MiB written in 1 MiB writes, then fsync
//	dataload seqread -file F [-direct]        the file read in 1 MiB reads
//	dataload sqlite -db F -journal wal|delete -tx N   N transactions of one row, one commit each
//
// -direct opens the file with O_DIRECT (around the page cache). SQLite is modernc.org/sqlite (pure Go,
// so the program is static), with synchronous=FULL: every commit is durable when it returns.
package dataload

import (
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// Result is what a workload prints.
type Result struct {
	// Workload is the subcommand.
	Workload string `json:"workload"`
	// Ops is how many units of work were done (files, entries, transactions, bytes), Unit says which.
	Ops  int64  `json:"ops"`
	Unit string `json:"unit"`
	// Seconds is how long the work took.
	Seconds float64 `json:"seconds"`
	// PerSecond is Ops over Seconds (files/s, tx/s...), for whoever reads the output.
	PerSecond float64 `json:"per_second"`
}

// Rate is Ops per second.
func (r Result) Rate() float64 { return float64(r.Ops) / r.Seconds }

// FileSize is the size of each file the create workload writes.
const FileSize = 4096

// filesPerDir is how many files create puts in each directory.
const filesPerDir = 100

// blockSize is the size of the sequential workloads' reads and writes.
const blockSize = 1 << 20

// Main runs the workload args name and prints its Result to stdout; it returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: dataload create|stat|read|write|seqread|sqlite [flags]")
		return 2
	}
	fl := flag.NewFlagSet("dataload "+args[0], flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("dir", "", "tree of the file workloads")
	file := fl.String("file", "", "file of the sequential workloads")
	db := fl.String("db", "", "SQLite database")
	n := fl.Int("n", 1000, "files to create")
	mib := fl.Int("mib", 32, "MiB to write")
	direct := fl.Bool("direct", false, "open with O_DIRECT")
	journal := fl.String("journal", "wal", "SQLite journal mode: wal or delete")
	tx := fl.Int("tx", 200, "SQLite transactions")
	if err := fl.Parse(args[1:]); err != nil {
		return 2
	}
	var r Result
	var err error
	switch args[0] {
	case "create":
		r, err = Create(*dir, *n)
	case "stat":
		r, err = Stat(*dir)
	case "read":
		r, err = Read(*dir)
	case "write":
		r, err = Write(*file, *mib, *direct)
	case "seqread":
		r, err = SeqRead(*file, *direct)
	case "sqlite":
		r, err = SQLite(*db, *journal, *tx)
	default:
		err = fmt.Errorf("unknown workload %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(stderr, "dataload:", err)
		return 1
	}
	r.Workload = args[0]
	r.PerSecond = r.Rate()
	if err := json.NewEncoder(stdout).Encode(r); err != nil {
		fmt.Fprintln(stderr, "dataload:", err)
		return 1
	}
	return 0
}

// Create makes dir and n files of FileSize bytes under it, filesPerDir a subdirectory, each written and
// fsynced before the next, then fsyncs the directories.
func Create(dir string, n int) (Result, error) {
	if dir == "" || n <= 0 {
		return Result{}, errors.New("create: -dir and a positive -n are required")
	}
	data := make([]byte, FileSize)
	for i := range data {
		data[i] = byte(i * 7)
	}
	t0 := time.Now()
	var dirs []string
	for i := range n {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/filesPerDir))
		if i%filesPerDir == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				return Result{}, err
			}
			dirs = append(dirs, sub)
		}
		f, err := os.OpenFile(filepath.Join(sub, fmt.Sprintf("f%05d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return Result{}, err
		}
		if _, err := f.Write(data); err != nil {
			_ = f.Close()
			return Result{}, err
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return Result{}, err
		}
		if err := f.Close(); err != nil {
			return Result{}, err
		}
	}
	for _, d := range append(dirs, dir) {
		if err := syncDir(d); err != nil {
			return Result{}, err
		}
	}
	return Result{Ops: int64(n), Unit: "files", Seconds: time.Since(t0).Seconds()}, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	return f.Sync()
}

// Stat lstats every entry of the tree at dir (the walk reads each directory; each entry is then
// lstat'ed, as ls -l or a backup tool does).
func Stat(dir string) (Result, error) {
	var n int64
	t0 := time.Now()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, err := os.Lstat(p); err != nil {
			return err
		}
		n++
		return nil
	})
	return Result{Ops: n, Unit: "entries", Seconds: time.Since(t0).Seconds()}, err
}

// Read reads every regular file of the tree at dir in full.
func Read(dir string) (Result, error) {
	var n int64
	buf := make([]byte, 64<<10)
	t0 := time.Now()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf); err != nil {
			return err
		}
		n++
		return nil
	})
	return Result{Ops: n, Unit: "files", Seconds: time.Since(t0).Seconds()}, err
}

// alignedBuffer is a blockSize buffer aligned to a page, as O_DIRECT wants.
func alignedBuffer() ([]byte, error) {
	return unix.Mmap(-1, 0, blockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
}

func openFlags(direct bool) int {
	if direct {
		return unix.O_DIRECT
	}
	return 0
}

// Write replaces file with mib MiB written in blockSize writes, then fsyncs it.
func Write(file string, mib int, direct bool) (Result, error) {
	if file == "" || mib <= 0 {
		return Result{}, errors.New("write: -file and a positive -mib are required")
	}
	buf, err := alignedBuffer()
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = unix.Munmap(buf) }()
	for i := range buf {
		buf[i] = byte(i*13 + 1)
	}
	_ = os.Remove(file)
	t0 := time.Now()
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY|openFlags(direct), 0o644)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = f.Close() }()
	for range mib {
		if _, err := f.Write(buf); err != nil {
			return Result{}, err
		}
	}
	if err := f.Sync(); err != nil {
		return Result{}, err
	}
	return Result{Ops: int64(mib) * blockSize, Unit: "bytes", Seconds: time.Since(t0).Seconds()}, f.Close()
}

// SeqRead reads file to its end in blockSize reads.
func SeqRead(file string, direct bool) (Result, error) {
	buf, err := alignedBuffer()
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = unix.Munmap(buf) }()
	t0 := time.Now()
	f, err := os.OpenFile(file, os.O_RDONLY|openFlags(direct), 0)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = f.Close() }()
	var n int64
	for {
		k, err := f.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) || (err == nil && k == 0) {
			break
		}
		if err != nil {
			return Result{}, err
		}
	}
	return Result{Ops: n, Unit: "bytes", Seconds: time.Since(t0).Seconds()}, nil
}

// SQLite makes a new database at db in journal mode (wal or delete, the rollback journal) with
// synchronous=FULL, and times tx transactions that each insert one row of 100 bytes and commit.
func SQLite(db, journal string, tx int) (Result, error) {
	if db == "" || tx <= 0 {
		return Result{}, errors.New("sqlite: -db and a positive -tx are required")
	}
	if journal != "wal" && journal != "delete" {
		return Result{}, fmt.Errorf("sqlite: journal mode %q: want wal or delete", journal)
	}
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if err := os.Remove(db + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Result{}, err
		}
	}
	// One connection: the pragmas hold for it, and the transactions are serial anyway.
	conn, err := sql.Open("sqlite", "file:"+db+"?_pragma=journal_mode("+journal+")&_pragma=synchronous(FULL)")
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = conn.Close() }()
	conn.SetMaxOpenConns(1)
	var mode string
	if err := conn.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		return Result{}, fmt.Errorf("sqlite: %w", err)
	}
	if mode != journal {
		return Result{}, fmt.Errorf("sqlite: journal mode is %q, asked for %q", mode, journal)
	}
	if _, err := conn.Exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)"); err != nil {
		return Result{}, fmt.Errorf("sqlite: %w", err)
	}
	row := make([]byte, 100)
	t0 := time.Now()
	for i := range tx {
		t, err := conn.Begin()
		if err != nil {
			return Result{}, fmt.Errorf("sqlite: %w", err)
		}
		if _, err := t.Exec("INSERT INTO t (id, v) VALUES (?, ?)", i, row); err != nil {
			_ = t.Rollback()
			return Result{}, fmt.Errorf("sqlite: %w", err)
		}
		if err := t.Commit(); err != nil {
			return Result{}, fmt.Errorf("sqlite: %w", err)
		}
	}
	return Result{Ops: int64(tx), Unit: "transactions", Seconds: time.Since(t0).Seconds()}, nil
}

package web

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

// eachLine calls f with each line of r (without its end) up to max
// bytes; longer lines (a torn write, a disk's zero-filled tail) are
// skipped whole, not read into memory.
func eachLine(r io.Reader, max int, f func(line string)) error {
	br := bufio.NewReaderSize(r, max)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			line = nil
		}
		if len(line) > 0 {
			if line[len(line)-1] == '\n' {
				line = line[:len(line)-1]
			}
			f(string(line))
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// appendLine adds line and its end to the file at path, synced. A line
// an earlier write left unended (a crash, a full disk) gets its end
// first, so that this one is not read as part of it.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	line += "\n"
	if st, serr := f.Stat(); serr == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, rerr := f.ReadAt(last, st.Size()-1); rerr == nil && last[0] != '\n' {
			line = "\n" + line
		}
	}
	_, err = f.WriteString(line)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("appending to %s: %w", path, err)
	}
	return nil
}

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// mergeLines reads the files at paths (named pipes that go test runs
// write to) at the same time and returns their lines as one stream, each
// line whole: two go test processes writing to one pipe could cut each
// other's longer lines. err reports, once the stream has ended, a file
// that could not be read.
func mergeLines(paths []string) (r io.Reader, err func() error) {
	pr, pw := io.Pipe()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if e := copyLines(p, pw, &mu); e != nil {
				mu.Lock()
				errs = append(errs, e)
				mu.Unlock()
			}
		}()
	}
	go func() {
		wg.Wait()
		pw.Close()
	}()
	return pr, func() error {
		mu.Lock()
		defer mu.Unlock()
		return errors.Join(errs...)
	}
}

// copyLines writes the lines of the file at path to w, each in one write
// under mu.
func copyLines(path string, w io.Writer, mu *sync.Mutex) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			mu.Lock()
			_, werr := w.Write(line)
			mu.Unlock()
			if werr != nil {
				return fmt.Errorf("%s: %w", path, werr)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
}

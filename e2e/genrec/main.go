// Command genrec writes a synthetic session recording straight into an
// auth server's recordings directory, for the web player's seek test
// (e2e/run.mjs): generated at test time, so no 100 MB file is committed.
//
//	go run ./e2e/genrec --dir DATA_DIR/auth/recordings --user U --minutes 30 --mb 100
//
// Every 100 ms of recorded time (tick k) prints lines "k=KKKKKK l=LL ...",
// sized so that the whole is about --mb MB of events; a marker every five
// minutes and an exit marker at the end. The screen at any time t is the
// last rows of tick floor(t*10), which the test checks after a seek. It
// prints the session id.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
)

func main() {
	dir := flag.String("dir", "", "the auth server's recordings directory (DATA_DIR/auth/recordings)")
	user := flag.String("user", "", "the user the session belongs to")
	node := flag.String("node", "00000000-0000-4000-8000-000000000000", "the node UUID in the header")
	minutes := flag.Int("minutes", 30, "recorded duration")
	mb := flag.Int("mb", 100, "approximate size of the events, MB")
	flag.Parse()
	if *dir == "" || *user == "" {
		fmt.Fprintln(os.Stderr, "genrec: --dir and --user are required")
		os.Exit(2)
	}
	if err := run(*dir, *user, *node, *minutes, *mb); err != nil {
		fmt.Fprintln(os.Stderr, "genrec:", err)
		os.Exit(1)
	}
}

func run(dir, user, node string, minutes, mb int) error {
	id := uuid.NewString()
	clock := clockwork.NewFakeClockAt(time.Now().Add(-time.Duration(minutes) * time.Minute))
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: id, Width: 80, Height: 24, User: user, Login: user, Node: node, NodeHostname: "genrec", Cluster: "e2e", Command: "genrec"},
		Sink:   &recording.DirSink{Storage: recording.DirStorage{Dir: dir}, Session: id},
		Deps:   observe.Deps{Clock: clock},
		// Far above the size: the cap is not what this tests.
		MaxBytes: int64(mb)<<20*2 + 64<<20,
	})
	if err != nil {
		return err
	}
	ticks := minutes * 60 * 10
	const lineLen = 80                           // 74 columns shown: no line wraps at the 80-column width
	perTick := mb << 20 / ticks / (lineLen + 30) // a line is ~30 bytes more as JSON
	if perTick < 1 {
		perTick = 1
	}
	filler := strings.Repeat(".", lineLen-20)
	var out bytes.Buffer
	for k := 0; k < ticks; k++ {
		if k > 0 {
			clock.Advance(100 * time.Millisecond)
		}
		if k%3000 == 0 {
			w.Marker(fmt.Sprintf("checkpoint %d", k/3000))
		}
		out.Reset()
		for l := 0; l < perTick; l++ {
			fmt.Fprintf(&out, "k=%06d l=%02d \x1b[2m%s\x1b[0m\r\n", k, l, filler)
		}
		w.Output(out.Bytes())
	}
	if _, err := w.Close("exit-status 0"); err != nil {
		return err
	}
	fmt.Println(id)
	return nil
}

package devcli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/berth-ci/berth/internal/dev/devstack"
)

// console is berth dev's terminal: short lines saying what happens, the output of the sample
// steps, and a table of the TaskRuns. On a terminal the table stays below everything else and
// is redrawn in place; elsewhere (a pipe, a file) each change of a TaskRun is a line of its own.
type console struct {
	mu    sync.Mutex
	w     io.Writer
	live  bool
	width int      // the terminal's columns, when live
	rows  int      // the terminal's rows, when live
	table []string // the table as drawn, when live
}

func newConsole(w io.Writer) *console {
	c := &console{w: w}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb" {
		c.live = true
		if width, rows, err := term.GetSize(int(f.Fd())); err == nil && width > 0 {
			c.width, c.rows = width, rows
		}
	}
	return c
}

// Write prints whole lines (the prefixed output of steps) above the table.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.above(func() { _, _ = c.w.Write(p) })
	return len(p), nil
}

// Printf prints a line above the table.
func (c *console) Printf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.above(func() { fmt.Fprintf(c.w, format+"\n", args...) })
}

// above erases the table, writes, and draws the table again below.
func (c *console) above(write func()) {
	c.erase()
	write()
	c.draw()
}

// setTable replaces the table (on a terminal).
func (c *console) setTable(lines []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return
	}
	c.erase()
	// The cursor cannot go up past the top of the screen: a table taller than it keeps its
	// header and newest rows.
	if c.rows > 4 && len(lines) > c.rows-2 {
		keep := c.rows - 4
		lines = append(append(lines[:2:2], fmt.Sprintf("  ... %d more", len(lines)-2-keep)), lines[len(lines)-keep:]...)
	}
	c.table = lines
	c.draw()
}

// keepTable leaves the table where it is, as part of the output above what comes next.
func (c *console) keepTable() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.table = nil
}

func (c *console) erase() {
	if len(c.table) > 0 {
		fmt.Fprintf(c.w, "\x1b[%dA\x1b[J", len(c.table))
	}
}

func (c *console) draw() {
	for _, line := range c.table {
		// A line the terminal wraps would take two rows, and the next erase one too few.
		if c.width > 0 && len(line) >= c.width {
			line = line[:c.width-1]
		}
		fmt.Fprintln(c.w, line)
	}
}

// step is a progress line: a component up, and how long it took.
func (c *console) step(component string, took time.Duration, detail string) {
	c.Printf("  %-18s %5.1fs  %s", component, took.Seconds(), detail)
}

// taskRunTable shows the stack's user TaskRuns on the console until its context ends.
type taskRunTable struct {
	con   *console
	board *devstack.Board
	mu    sync.Mutex
	shown map[string]string // by TaskRun: its line as last printed (not live)
}

func newTaskRunTable(con *console, board *devstack.Board) *taskRunTable {
	return &taskRunTable{con: con, board: board, shown: map[string]string{}}
}

// run refreshes the table until ctx ends.
func (t *taskRunTable) run(ctx context.Context) {
	for {
		t.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// refresh reads the TaskRuns and shows what changed.
func (t *taskRunTable) refresh(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rows, err := t.board.Rows(ctx)
	if err != nil || len(rows) == 0 {
		return // the stack's failure, if any, is told by its supervisor
	}
	if t.con.live {
		t.con.setTable(tableLines(rows))
		return
	}
	for _, r := range rows {
		// Waited grows while a task waits: a line per change of state, place or host, not per tick.
		key := r.State + "|" + r.Host + "|" + fmt.Sprint(r.Position, r.Waiters)
		if t.shown[r.Key()] == key {
			continue
		}
		t.shown[r.Key()] = key
		t.con.Printf("  taskrun  %-30s %-14s %-14s %-22s waited %s%s", r.Key(), orDash(r.Platform), stateText(r), orDash(r.Host), waited(r.Waited), messageText(r))
	}
}

func tableLines(rows []devstack.TaskRunRow) []string {
	header := []string{"TASKRUN", "PLATFORM", "STATE", "HOST/VM", "WAITED"}
	cells := [][]string{header}
	for _, r := range rows {
		cells = append(cells, []string{r.Key(), orDash(r.Platform), stateText(r), orDash(r.Host), waited(r.Waited) + messageText(r)})
	}
	widths := make([]int, len(header))
	for _, row := range cells {
		for i, cell := range row[:len(row)-1] {
			widths[i] = max(widths[i], len(cell))
		}
	}
	lines := []string{""}
	for _, row := range cells {
		var b strings.Builder
		b.WriteString("  ")
		for i, cell := range row {
			if i < len(row)-1 {
				fmt.Fprintf(&b, "%-*s  ", widths[i], cell)
			} else {
				b.WriteString(cell)
			}
		}
		lines = append(lines, b.String())
	}
	return lines
}

func stateText(r devstack.TaskRunRow) string {
	if r.State == devstack.StateWaiting && r.Position > 0 {
		return fmt.Sprintf("waiting %d/%d", r.Position, r.Waiters)
	}
	return r.State
}

func messageText(r devstack.TaskRunRow) string {
	if r.Message == "" {
		return ""
	}
	return "  " + r.Message
}

func waited(d time.Duration) string {
	if d == devstack.NoWait {
		return "-"
	}
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

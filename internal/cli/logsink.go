package cli

import (
	"slices"

	"github.com/go-logr/logr"
)

// deferredValues is a LogSink that keeps the key/value pairs given to WithValues and hands them
// to the sink under it only when a line is logged. zap encodes a logger's values as it is made
// (With clones its encoder and buffer), and controller-runtime makes a logger with three sets of
// values for every reconcile, most of which log nothing: on the bench that was 7% of all the
// controller allocated. Here a reconcile that logs nothing costs a slice of its values, and a
// line logged carries the same fields in the same order as before.
type deferredValues struct {
	sink   logr.LogSink
	values []any
}

// deferValues wraps sink, already initialised by the logr.Logger it came from.
func deferValues(sink logr.LogSink) logr.LogSink { return &deferredValues{sink: sink} }

// Init adds this sink's own frame to the depth the sink under it skips to find the caller.
func (d *deferredValues) Init(logr.RuntimeInfo) {
	if s, ok := d.sink.(logr.CallDepthLogSink); ok {
		d.sink = s.WithCallDepth(1)
	}
}

func (d *deferredValues) Enabled(level int) bool { return d.sink.Enabled(level) }

func (d *deferredValues) Info(level int, msg string, keysAndValues ...any) {
	d.sink.Info(level, msg, d.with(keysAndValues)...)
}

func (d *deferredValues) Error(err error, msg string, keysAndValues ...any) {
	d.sink.Error(err, msg, d.with(keysAndValues)...)
}

// WithValues keeps a copy of keysAndValues: the caller may reuse its slice after the call,
// where zap's With had encoded the values already.
func (d *deferredValues) WithValues(keysAndValues ...any) logr.LogSink {
	return &deferredValues{sink: d.sink, values: append(slices.Clip(d.values), keysAndValues...)}
}

func (d *deferredValues) WithName(name string) logr.LogSink {
	return &deferredValues{sink: d.sink.WithName(name), values: d.values}
}

func (d *deferredValues) WithCallDepth(depth int) logr.LogSink {
	s, ok := d.sink.(logr.CallDepthLogSink)
	if !ok {
		return d
	}
	return &deferredValues{sink: s.WithCallDepth(depth), values: d.values}
}

// with is the kept values followed by more, for one line.
func (d *deferredValues) with(more []any) []any {
	if len(d.values) == 0 {
		return more
	}
	return append(slices.Clip(d.values), more...)
}

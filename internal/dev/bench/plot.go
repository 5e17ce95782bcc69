package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	// The formats WritePlot writes.
	_ "gonum.org/v1/plot/vg/vgimg"
	_ "gonum.org/v1/plot/vg/vgsvg"
)

// WritePlot draws, for every run, the distribution of creation→secret latency (a CDF, on a
// log scale: a baseline and berth can be orders of magnitude apart) beside the tasks served
// over time from the first task's creation, into an SVG or PNG file (by path's extension).
// Each run is one line, named by its label.
func WritePlot(path string, results []*Result, label func(*Result) string) error {
	format := strings.TrimPrefix(filepath.Ext(path), ".")
	if format != "svg" && format != "png" {
		return fmt.Errorf("plot %s: want a .svg or .png file", path)
	}
	if !slices.ContainsFunc(results, func(r *Result) bool { return len(r.Timeline.served()) > 0 }) {
		return fmt.Errorf("no run served a task: nothing to plot in %s", path)
	}
	latency := plot.New()
	latency.Title.Text = "creation → secret latency"
	latency.X.Label.Text = "ms (log scale)"
	latency.X.Scale = plot.LogScale{}
	latency.X.Tick.Marker = plot.LogTicks{Prec: -1}
	latency.Y.Label.Text = "fraction of served tasks"
	latency.Y.Min, latency.Y.Max = 0, 1
	latency.Add(plotter.NewGrid())

	served := plot.New()
	served.Title.Text = "tasks served over time"
	served.X.Label.Text = "s since the first task's creation"
	served.Y.Label.Text = "tasks served"
	served.Y.Tick.Marker = wholeTicks{}
	served.Add(plotter.NewGrid())

	for i, r := range results {
		cdf, over := latencyCDF(r.Timeline), servedOverTime(r.Timeline)
		if len(cdf) == 0 {
			continue
		}
		for _, p := range []struct {
			plot *plot.Plot
			xys  plotter.XYs
		}{{latency, cdf}, {served, over}} {
			line, err := plotter.NewLine(p.xys)
			if err != nil {
				return err
			}
			line.Color, line.Dashes = plotutil.Color(i), plotutil.Dashes(i)
			line.Width = vg.Points(1.5)
			p.plot.Add(line)
			p.plot.Legend.Add(label(r), line)
		}
	}
	latency.Legend.Top, latency.Legend.Left = true, true
	served.Legend.Top, served.Legend.Left = true, true

	img, err := draw.NewFormattedCanvas(28*vg.Centimeter, 11*vg.Centimeter, format)
	if err != nil {
		return err
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Centimeter, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	canvases := plot.Align([][]*plot.Plot{{latency, served}}, tiles, draw.New(img))
	latency.Draw(canvases[0][0])
	served.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// latencyCDF is, for each served task in order of latency, its latency in ms and the fraction
// of served tasks at most that slow.
func latencyCDF(t Timeline) plotter.XYs {
	tasks := t.served()
	ms := make([]float64, len(tasks))
	for i, task := range tasks {
		// A log scale has no zero: a latency under a tenth of a millisecond is drawn there.
		ms[i] = math.Max(0.1, float64(task.Secret.Sub(task.Created).Microseconds())/1000)
	}
	slices.Sort(ms)
	xys := make(plotter.XYs, len(ms))
	for i, v := range ms {
		xys[i] = plotter.XY{X: v, Y: float64(i+1) / float64(len(ms))}
	}
	return xys
}

// servedOverTime is, for each served task in order of its secret, when it got it (s since the
// timeline's start) and how many had by then.
func servedOverTime(t Timeline) plotter.XYs {
	tasks := t.served()
	s := make([]float64, len(tasks))
	for i, task := range tasks {
		s[i] = task.Secret.Sub(t.Start).Seconds()
	}
	slices.Sort(s)
	xys := make(plotter.XYs, 0, len(s)+1)
	xys = append(xys, plotter.XY{X: 0, Y: 0})
	for i, v := range s {
		xys = append(xys, plotter.XY{X: v, Y: float64(i + 1)})
	}
	return xys
}

// wholeTicks are the default ticks labelled as whole numbers (counts of tasks).
type wholeTicks struct{}

func (wholeTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', 0, 64)
		}
	}
	return ticks
}

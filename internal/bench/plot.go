package bench

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// PlotCDF draws the latency CDFs of every row of one case (op, size,
// depth) on one chart — latency in µs on a log-scale x axis, the fraction
// of operations at or below it on y, a legend naming each system — and
// writes it to file as PNG or SVG (by its extension). farmem's tiers are
// solid lines, the systems compared with them dashed.
func PlotCDF(file string, rows []Row, op Op, size, depth int) error {
	ext := strings.ToLower(filepath.Ext(file))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("%w: plot file %q: name it .png or .svg", ErrInvalid, file)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Latency CDF: %s %s, %d in flight", sizeName(size), plural(op), depth)
	p.X.Label.Text = "latency per operation (µs, log scale)"
	p.Y.Label.Text = "fraction of operations ≤ latency"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Y.Tick.Marker = plot.ConstantTicks(yTicks())
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(8), vg.Points(8)
	lo, hi := math.Inf(1), 0.0
	n := 0
	for _, r := range rows {
		if r.Op != op || r.Size != size || r.Depth != depth || r.Latency == nil || r.Latency.Count() == 0 {
			continue
		}
		cdf := r.Latency.CDF()
		xys := make(plotter.XYs, len(cdf))
		for i, pt := range cdf {
			xys[i].X = max(float64(pt.Latency)/1e3, 0.001)
			xys[i].Y = pt.Fraction
		}
		lo, hi = math.Min(lo, xys[0].X), math.Max(hi, xys[len(xys)-1].X)
		line, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", r.System, err)
		}
		line.Color = palette[n%len(palette)]
		line.Width = vg.Points(2)
		if !strings.HasPrefix(r.System, "farmem-") {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("%s (p50 %s)", r.System, dur(r.P50Ns)), line)
		n++
	}
	if n == 0 {
		return fmt.Errorf("%w: no rows for %s of %d B at depth %d to plot (run that case, or pick another with --plot-size/--plot-depth)", ErrInvalid, op, size, depth)
	}
	// Room on the right for the legend, below the curves' tops.
	p.X.Min, p.X.Max = lo/1.5, hi*8
	if err := p.Save(10*vg.Inch, 6*vg.Inch, file); err != nil {
		return fmt.Errorf("write plot %s: %w", file, err)
	}
	return nil
}

func plural(op Op) string {
	if op == Atomic {
		return "atomics"
	}
	return string(op) + "s"
}

// palette is eight colours told apart also in print and by most colour
// blind readers (Okabe and Ito's, with black for the eighth).
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255},   // blue
	color.RGBA{213, 94, 0, 255},    // vermillion
	color.RGBA{0, 158, 115, 255},   // bluish green
	color.RGBA{204, 121, 167, 255}, // reddish purple
	color.RGBA{230, 159, 0, 255},   // orange
	color.RGBA{86, 180, 233, 255},  // sky blue
	color.RGBA{0, 0, 0, 255},       // black
	color.RGBA{153, 0, 0, 255},     // dark red
}

// yTicks labels every tenth, and the 0.99 line where tails show.
func yTicks() []plot.Tick {
	var ts []plot.Tick
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprintf("%.1f", v)})
	}
	return append(ts, plot.Tick{Value: 0.99, Label: ""})
}

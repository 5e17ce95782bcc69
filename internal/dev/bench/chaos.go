package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"
)

// chaosPoints draws when to kill the controller: after how many served tasks, spread over the
// run (1 to tasks-1, sorted; repeats only when there are more kills than that).
func chaosPoints(kills, tasks int, rnd *rand.Rand) []int {
	if kills <= 0 {
		return nil
	}
	span := max(tasks-1, 1)
	var points []int
	if kills <= span {
		for _, i := range rnd.Perm(span)[:kills] {
			points = append(points, i+1)
		}
	} else {
		for range kills {
			points = append(points, 1+rnd.IntN(span))
		}
	}
	slices.Sort(points)
	return points
}

// runChaos kills the controller and starts it again at each point, once served() has reached
// it and at least one task was served since the last kill (so the controller always makes
// progress between two kills), after a random delay of up to a second, so kills fall at any
// moment of the controller's work. It returns when every kill is done or ctx ends.
func runChaos(ctx context.Context, p *controllerProcess, points []int, served func() int, log io.Writer) error {
	last := -1
	for _, point := range points {
		for {
			n := served()
			if n >= point && n > last {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rand.N(time.Second)):
		}
		last = served()
		if err := p.killAndRestart(); err != nil {
			return err
		}
		fmt.Fprintf(log, "chaos: killed the controller after %d served tasks (kill %d of %d) and started it again\n", last, p.killCount(), len(points))
	}
	return nil
}

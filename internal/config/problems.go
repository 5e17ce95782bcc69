package config

import (
	"fmt"
	"sort"
	"strings"
)

// Severity says whether a problem stops a config from being used.
type Severity string

const (
	Error   Severity = "error"
	Warning Severity = "warning"
)

// Problem is one thing wrong with a config, tied to the key it is about.
type Problem struct {
	Severity Severity
	// Platform is the platform the problem concerns, empty for the file as a whole (or for a
	// host whose platform cannot be told).
	Platform Platform
	Key      string
	Message  string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s: %s: %s", p.Severity, p.Key, p.Message)
}

// Problems are all the problems of one config, errors first, then by key.
type Problems []Problem

// HasErrors tells whether the config must not be used.
func (ps Problems) HasErrors() bool {
	for _, p := range ps {
		if p.Severity == Error {
			return true
		}
	}
	return false
}

// Errors returns only the errors.
func (ps Problems) Errors() Problems {
	var out Problems
	for _, p := range ps {
		if p.Severity == Error {
			out = append(out, p)
		}
	}
	return out
}

// Summary is a one-paragraph account for an Event or a log line.
func (ps Problems) Summary() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "; ")
}

func (ps Problems) sort() {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].Severity != ps[j].Severity {
			return ps[i].Severity == Error
		}
		return ps[i].Key < ps[j].Key
	})
}

// suggest returns the candidate closest to word if it is close enough to be a likely typo
// (the first of equals in sorted order, so the answer is stable).
func suggest(word string, candidates []string) string {
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestDist := "", len(word)/3+2
	for _, c := range sorted {
		if d := editDistance(word, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Package warning is berth's convention for warnings in its logs. logr has only info (at
// verbosity levels) and error, so a warning is an info line carrying severity=warning: it is
// something a person should look at, caused outside berth (a tenant's edit, an operator's
// config, a host or cloud that failed), while berth carries on. Error lines are kept for what
// berth itself failed to do. Filter them with, for example, jq 'select(.severity=="warning")'.
package warning

import "github.com/go-logr/logr"

// Key and Value mark a warning line.
const (
	Key   = "severity"
	Value = "warning"
)

// Log writes msg as a warning, with the key/value pairs after it.
func Log(log logr.Logger, msg string, keysAndValues ...any) {
	log.Info(msg, append([]any{Key, Value}, keysAndValues...)...)
}

package ibmz

import "time"

// Tests wait milliseconds where production waits seconds.
func init() {
	retryWaitMin, retryWaitMax = time.Millisecond, 10*time.Millisecond
	maxInlineWait = 2 * time.Second
}

// InstanceName is instanceName, for tests that craft names.
var InstanceName = instanceName

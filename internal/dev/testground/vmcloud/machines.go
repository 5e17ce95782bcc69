//go:build linux

package vmcloud

import (
	"errors"
)

// The Go face of a Cloud, for the stand-ins of real clouds' APIs (EC2, IBM VPC, Power VS):
// each speaks its own wire protocol and keeps its own view of instances, and leaves the
// machines themselves, and every fault of theirs, to a Cloud.

// Errors of Launch and Terminate.
var (
	ErrCapacity = errors.New("no capacity for a new instance now")
	ErrQuota    = errors.New("the account's instance quota is used up")
	ErrNotFound = errors.New("no such instance, or it is gone already")
)

// Launch starts an instance for token, or returns the one token started before, whatever has
// become of it since (created is false then). Armed FailLaunches answer ErrCapacity, a full
// quota ErrQuota; throttling is the API's business and does not apply here.
func (c *Cloud) Launch(token, name string, tags map[string]string) (inst Instance, created bool, err error) {
	if token == "" {
		return Instance{}, false, errors.New("vmcloud: a launch needs a token")
	}
	res := c.launch(token, name, tags)
	if res.err != nil {
		switch res.err.Code {
		case codeQuota:
			return Instance{}, false, ErrQuota
		case codeCapacity:
			return Instance{}, false, ErrCapacity
		}
		return Instance{}, false, errors.New(res.err.Message)
	}
	return res.inst, res.created, nil
}

// Terminate ends an instance and returns it, gone, once its host is stopped; ErrNotFound if
// there is no such instance or it is gone already. A host that stops badly is logged, not
// returned: the instance is gone either way.
func (c *Cloud) Terminate(id string) (Instance, error) {
	inst, ok, _ := c.end(id, "terminated", false)
	if !ok {
		return Instance{}, ErrNotFound
	}
	return inst, nil
}

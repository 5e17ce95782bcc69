package ibmp

import (
	"context"
	"net/http"

	"github.com/IBM-Cloud/power-go-client/power/models"
)

// The disk size. Power VS gives an instance a boot volume of its image's size; a platform
// that asks for more (disk, in GB) gets it as upstream does, by growing the boot volume once
// the instance is up (PUT /pcloud/v1/cloud-instances/{id}/volumes/{volume_id} with a size).
// Until the volume has that size the instance is pending, so berth never hands out a VM with
// a small disk. The state is the volume's own, read at each look, so the work is idempotent:
// a look (after a crash, or by a second replica) asks for a resize only of a settled volume
// smaller than the size, waits while one is under way, and never shrinks a volume.

// diskSized tells whether instance id's boot volume has the platform's disk size, asking
// for a resize when it is settled and smaller.
func (p *Provider) diskSized(ctx context.Context, op, id string) (bool, error) {
	if p.disk == 0 {
		return true, nil
	}
	p.mu.Lock()
	done := p.sized[id]
	p.mu.Unlock()
	if done {
		return true, nil
	}
	boot, err := p.bootVolume(ctx, op, id)
	if err != nil || boot == nil || !settled(boot) {
		return false, err // not attached yet, or still being made or resized: look again
	}
	if size(boot) >= p.disk {
		p.mu.Lock()
		p.sized[id] = true
		p.mu.Unlock()
		return true, nil
	}
	err = p.call(ctx, op, func(c api) error {
		_, err := c.volumes().UpdateVolume(deref(boot.VolumeID), &models.UpdateVolume{Size: p.disk})
		return err
	})
	if s := statusOf(err); s == http.StatusBadRequest || s == http.StatusConflict {
		// A resize retried after its answer was lost is refused, as not growing the volume
		// or as one under way: the volume says whether it was ours.
		if again, aerr := p.bootVolume(ctx, op, id); aerr == nil && again != nil && (!settled(again) || size(again) >= p.disk) {
			return false, nil
		}
	}
	// Resized: the next look sees the volume extending or grown.
	return false, err
}

// bootVolume is instance id's boot volume, or nil when none is attached yet.
func (p *Provider) bootVolume(ctx context.Context, op, id string) (*models.VolumeReference, error) {
	var vols *models.Volumes
	err := p.call(ctx, op, func(c api) error {
		var err error
		vols, err = c.volumes().GetAllInstanceVolumes(id)
		return err
	})
	if err != nil || vols == nil {
		return nil, err
	}
	for _, v := range vols.Volumes {
		if v != nil && v.BootVolume != nil && *v.BootVolume {
			return v, nil
		}
	}
	return nil, nil
}

// settled tells a volume in use (or free) from one being made, resized ("extending") or
// failed: only a settled volume may be resized, and only a settled one has its final size.
// A volume whose resize failed stays unsettled and its instance pending, which berth ends
// as stuck.
func settled(v *models.VolumeReference) bool {
	s := deref(v.State)
	return s == "in-use" || s == "available"
}

func size(v *models.VolumeReference) float64 {
	if v.Size == nil {
		return 0
	}
	return *v.Size
}

func (p *Provider) forgetSized(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.sized, id)
}

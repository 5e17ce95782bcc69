package cluster

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// checkAllowed refuses, before anything is created, a template that does not exist or that a
// ClusterTemplateQuota of the space does not allow or has no room left for, with a message
// that says which quota and what is in use. It counts the instances that exist now rather than
// the quota's status, which the service updates later: a pre-check must not refuse what the
// service would accept. What the space's credentials may not read is left to the service's
// admission check.
func checkAllowed(ctx context.Context, space *Space, template string, progress io.Writer) error {
	costs := templateCosts{space: space, known: map[string]int64{}}
	cost, costKnown, err := costs.of(ctx, template)
	if err != nil {
		return err
	}
	quotas := newList(quotaGVK)
	if err := space.Client.List(ctx, quotas, client.InNamespace(space.Namespace)); err != nil {
		if unreadable(err) {
			fmt.Fprintf(progress, "cannot read the ClusterTemplateQuotas of space %s (%v); leaving the quota check to the cluster service\n", space.Namespace, err)
			return nil
		}
		return fmt.Errorf("reading the ClusterTemplateQuotas of space %s: %w", space.Namespace, err)
	}
	if len(quotas.Items) == 0 {
		return nil
	}
	use, useErr := currentUse(ctx, space, &costs)
	for i := range quotas.Items {
		q, err := decode[quotaView](&quotas.Items[i])
		if err != nil {
			return err
		}
		ref := fmt.Sprintf("ClusterTemplateQuota %s/%s", q.Namespace, q.Name)
		var allowed []string
		count, found := int64(0), false
		for _, a := range q.Spec.AllowedTemplates {
			allowed = append(allowed, a.Name)
			if a.Name == template {
				count, found = a.Count, true
			}
		}
		if !found {
			return fmt.Errorf("template %s is not allowed in space %s: %s allows only %s", template, space.Namespace, ref, orNone(strings.Join(allowed, ", ")))
		}
		inUse, names := use.count(template), use.names[template]
		if useErr != nil {
			inUse, names = statusCount(q, template), nil
		}
		if count > 0 && inUse >= count {
			return fmt.Errorf("%s allows %d cluster(s) of template %s and %d exist (%s); deprovision one first", ref, count, template, inUse, orNone(strings.Join(names, ", ")))
		}
		if q.Spec.Budget > 0 && costKnown {
			spent := use.spent
			if useErr != nil || !use.spentKnown {
				spent = q.Status.BudgetSpent
			}
			if spent+cost > q.Spec.Budget {
				return fmt.Errorf("%s has a budget of %d and %d is spent; template %s costs %d more; deprovision a cluster first", ref, q.Spec.Budget, spent, template, cost)
			}
		}
	}
	return nil
}

// use is what the space's existing instances take of a quota.
type use struct {
	names      map[string][]string // template → instance names
	spent      int64
	spentKnown bool
}

func (u use) count(template string) int64 { return int64(len(u.names[template])) }

func currentUse(ctx context.Context, space *Space, costs *templateCosts) (use, error) {
	list := newList(instanceGVK)
	if err := space.Client.List(ctx, list, client.InNamespace(space.Namespace)); err != nil {
		return use{}, err
	}
	u := use{names: map[string][]string{}, spentKnown: true}
	for i := range list.Items {
		inst, err := instanceFrom(&list.Items[i])
		if err != nil {
			return use{}, err
		}
		u.names[inst.Template] = append(u.names[inst.Template], inst.Name)
		cost, known, err := costs.of(ctx, inst.Template)
		u.spentKnown = u.spentKnown && known && err == nil
		u.spent += cost
	}
	for _, names := range u.names {
		slices.Sort(names)
	}
	return u, nil
}

func statusCount(q quotaView, template string) int64 {
	for _, t := range q.Status.TemplateInstances {
		if t.Name == template {
			return t.Count
		}
	}
	return 0
}

// templateCosts reads the cost of ClusterTemplates, each once.
type templateCosts struct {
	space *Space
	known map[string]int64
}

// of returns a template's cost and whether it could be read. A template that does not exist
// is an error: no instance of it can ever be made.
func (t *templateCosts) of(ctx context.Context, template string) (int64, bool, error) {
	if cost, ok := t.known[template]; ok {
		return cost, true, nil
	}
	u := newObject(templateGVK, "", template)
	err := t.space.Client.Get(ctx, client.ObjectKeyFromObject(u), u)
	switch {
	case apierrors.IsNotFound(err):
		return 0, false, fmt.Errorf("there is no ClusterTemplate %s", template)
	case err != nil:
		// Spaces usually may not read cluster-scoped objects; the cost is then unknown.
		return 0, false, nil
	}
	v, err := decode[templateView](u)
	if err != nil {
		return 0, false, err
	}
	t.known[template] = v.Spec.Cost
	return v.Spec.Cost, true, nil
}

// unreadable is an error that means "you may not know", not "something broke".
func unreadable(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

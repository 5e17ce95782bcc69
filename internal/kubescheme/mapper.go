package kubescheme

import (
	"net/http"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// NewMapper is the manager's RESTMapper: controller-runtime's dynamic one, with each mapping
// it found remembered (see rememberingMapper). Use it as ctrl.Options.MapperProvider.
func NewMapper(cfg *rest.Config, httpClient *http.Client) (meta.RESTMapper, error) {
	m, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	return Remembering(m), nil
}

// Remembering answers RESTMapping from what m answered before for the same kind and versions.
//
// The client asks for a mapping on every request and every cache read (is the kind
// namespaced, what is its resource). The dynamic mapper answers by asking each API group it
// knows in turn, and every group that lacks the kind makes an error value on the way: in a
// controller that sends a few requests per task, that was an eighth of all it allocated. A
// mapping it found does not change while berth runs: the dynamic mapper keeps it for good as
// well (it reloads a group only for a kind it cannot find), and a resource's scope is fixed
// (a CRD's spec.scope is immutable). Errors are not remembered, so a kind that is not there
// yet is looked up again, reloads included, as before. One entry per kind berth uses: no
// tenant object adds one.
func Remembering(m meta.RESTMapper) meta.RESTMapper {
	return &rememberingMapper{RESTMapper: m}
}

type rememberingMapper struct {
	meta.RESTMapper
	found sync.Map // mappingKey → *meta.RESTMapping
}

type mappingKey struct {
	gk       schema.GroupKind
	versions string
}

// RESTMapping: the one the delegate gave for this kind and versions, or its answer now.
func (m *rememberingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	key := mappingKey{gk: gk, versions: strings.Join(versions, ",")}
	if found, ok := m.found.Load(key); ok {
		return found.(*meta.RESTMapping), nil
	}
	mapping, err := m.RESTMapper.RESTMapping(gk, versions...)
	if err != nil {
		return nil, err
	}
	m.found.Store(key, mapping)
	return mapping, nil
}

package v2api

import (
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v2error"
)

// keysPrefix is the URL prefix of the v2 keys API.
const keysPrefix = "/v2/keys"

// storeKeysPrefix is where etcd keeps user keys inside its v2 store ("/0"
// holds cluster data). We use the same layout so that paths, the read-only
// root and error causes behave exactly like etcd's.
const storeKeysPrefix = "/1"

// request is one parsed v2 keys request: the same fields etcd's v2 HTTP
// front end parsed into its RequestV2.
type request struct {
	Method           string
	Path             string // store path, under storeKeysPrefix
	Value            string
	Dir              bool
	PrevValue        string
	PrevIndex        uint64
	PrevExist        *bool
	Wait             bool
	WaitIndex        uint64
	Recursive        bool
	Sorted           bool
	Stream           bool
	Refresh          bool
	TTL              *uint64
	NoValueOnSuccess bool
}

// op is the store operation a request maps to.
type op string

const (
	opGet              op = "get"
	opWatch            op = "watch"
	opSet              op = "set"
	opCreate           op = "create"
	opCreateInOrder    op = "createInOrder"
	opUpdate           op = "update"
	opCompareAndSwap   op = "compareAndSwap"
	opDelete           op = "delete"
	opCompareAndDelete op = "compareAndDelete"
)

// op decides which store call serves r, the way etcd's v2 applier did.
func (r *request) op() op {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if r.Wait {
			return opWatch
		}
		return opGet
	case http.MethodPost:
		return opCreateInOrder
	case http.MethodDelete:
		if r.PrevIndex > 0 || r.PrevValue != "" {
			return opCompareAndDelete
		}
		return opDelete
	default: // PUT
		if r.PrevExist != nil {
			if *r.PrevExist {
				if r.PrevIndex == 0 && r.PrevValue == "" {
					return opUpdate
				}
				return opCompareAndSwap
			}
			return opCreate
		}
		if r.PrevIndex > 0 || r.PrevValue != "" {
			return opCompareAndSwap
		}
		return opSet
	}
}

// expireTime is the absolute expiry the request asks for (zero: permanent).
func (r *request) expireTime(now time.Time) time.Time {
	if r.TTL == nil {
		return time.Time{}
	}
	return now.Add(time.Duration(*r.TTL) * time.Second)
}

func reqErr(code int, cause string) *v2error.Error {
	return v2error.NewError(code, cause, 0)
}

// parseRequest validates an HTTP request on /v2/keys the way etcd's v2 front
// end did: GET and DELETE parameters come from the query string, PUT and POST
// ones from the form body or the query string, and every malformed field is
// an etcd error (codes 2xx), never a panic.
func parseRequest(hr *http.Request) (*request, *v2error.Error) {
	if err := hr.ParseForm(); err != nil {
		return nil, reqErr(v2error.EcodeInvalidForm, err.Error())
	}
	p := hr.URL.Path
	if !strings.HasPrefix(p, keysPrefix) || (len(p) > len(keysPrefix) && p[len(keysPrefix)] != '/') {
		return nil, reqErr(v2error.EcodeInvalidForm, "incorrect key prefix")
	}
	key, ok := keyPath(p[len(keysPrefix):])
	if !ok {
		return nil, reqErr(v2error.EcodeInvalidForm, "incorrect key prefix")
	}
	form := hr.Form
	r := &request{
		Method: hr.Method,
		Path:   key,
		Value:  form.Get("value"),
	}
	var err *v2error.Error
	if r.PrevIndex, err = formUint(form, "prevIndex", v2error.EcodeIndexNaN); err != nil {
		return nil, err
	}
	if r.WaitIndex, err = formUint(form, "waitIndex", v2error.EcodeIndexNaN); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		name string
		dst  *bool
	}{
		{"recursive", &r.Recursive}, {"sorted", &r.Sorted}, {"wait", &r.Wait}, {"dir", &r.Dir},
		{"quorum", new(bool)}, {"stream", &r.Stream}, {"noValueOnSuccess", &r.NoValueOnSuccess},
	} {
		if *b.dst, err = formBool(form, b.name); err != nil {
			return nil, err
		}
	}
	if r.Wait && hr.Method != http.MethodGet {
		return nil, reqErr(v2error.EcodeInvalidField, `"wait" can only be used with GET requests`)
	}
	if vs, ok := form["prevValue"]; ok {
		if vs[0] == "" {
			return nil, reqErr(v2error.EcodePrevValueRequired, `"prevValue" cannot be empty`)
		}
		r.PrevValue = vs[0]
	}
	if form.Get("ttl") != "" {
		ttl, perr := strconv.ParseUint(form["ttl"][0], 10, 64)
		if perr != nil || ttl > maxTTLSeconds {
			return nil, reqErr(v2error.EcodeTTLNaN, `invalid value for "ttl"`)
		}
		r.TTL = &ttl
	}
	if _, ok := form["prevExist"]; ok {
		pe, err := formBool(form, "prevExist")
		if err != nil {
			return nil, reqErr(v2error.EcodeInvalidField, "invalid value for prevExist")
		}
		r.PrevExist = &pe
	}
	if _, ok := form["refresh"]; ok {
		if r.Refresh, err = formBool(form, "refresh"); err != nil {
			return nil, reqErr(v2error.EcodeInvalidField, "invalid value for refresh")
		}
		if r.Refresh {
			if _, ok := form["value"]; ok && r.Value != "" {
				return nil, reqErr(v2error.EcodeRefreshValue, "A value was provided on a refresh")
			}
			if r.TTL == nil {
				return nil, reqErr(v2error.EcodeRefreshTTLRequired, "No TTL value set")
			}
		}
	}
	return r, nil
}

// keyPath is the store's path of a key as a client names it ("/a/b" is
// "/1/a/b"), cleaned as etcd cleans it; false for a key that ".." would take
// out of the keys' namespace (etcd 3.4's mux redirects such a request to a
// path outside /v2/keys, so it never stores one).
func keyPath(key string) (string, bool) {
	p := path.Join(storeKeysPrefix, key)
	return p, p == storeKeysPrefix || strings.HasPrefix(p, storeKeysPrefix+"/")
}

// maxTTLSeconds keeps now+ttl inside time.Time's range (etcd overflowed
// silently into the past; we refuse instead).
const maxTTLSeconds = 100 * 365 * 24 * 3600

func formUint(form url.Values, key string, code int) (uint64, *v2error.Error) {
	vs, ok := form[key]
	if !ok {
		return 0, nil
	}
	i, err := strconv.ParseUint(vs[0], 10, 64)
	if err != nil {
		return 0, reqErr(code, `invalid value for "`+key+`"`)
	}
	return i, nil
}

func formBool(form url.Values, key string) (bool, *v2error.Error) {
	vs, ok := form[key]
	if !ok {
		return false, nil
	}
	b, err := strconv.ParseBool(vs[0])
	if err != nil {
		return false, reqErr(v2error.EcodeInvalidField, `invalid value for "`+key+`"`)
	}
	return b, nil
}

package namesrv

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Limits of the KV config.
const (
	// MaxKVEntries bounds the number of KV config entries, all namespaces
	// together; a PUT beyond it is refused.
	MaxKVEntries = 1 << 16
	// maxKVFile bounds the persisted file read by New.
	maxKVFile = 64 << 20
	// kvFileName is Java's file name (NamesrvConfig.kvConfigPath).
	kvFileName = "kvConfig.json"
)

// NamespaceOrderTopicConfig is the KV namespace of ordered-topic queue
// layouts ("broker-a:4;broker-b:4" per topic), returned to brokers on
// registration and, with WithOrderMessage, put into routes.
const NamespaceOrderTopicConfig = "ORDER_TOPIC_CONFIG"

// ErrKVFull is returned (as a SYSTEM_ERROR reply) when a PUT_KV_CONFIG
// would exceed MaxKVEntries.
var ErrKVFull = errors.New("namesrv: KV config full")

// kvStore is the KV config (Java KVConfigManager): namespaces of string
// tables, optionally persisted to one JSON file. Guarded by its own mutex,
// never held together with the route table's.
type kvStore struct {
	path string // "" = memory only
	mu   struct {
		sync.Mutex
		ns map[string]map[string]string
		n  int // entries, all namespaces
	}
}

// kvFile is the persisted form, Java's KVConfigSerializeWrapper.
type kvFile struct {
	ConfigTable map[string]map[string]string `json:"configTable"`
}

func newKVStore(dir string) (*kvStore, error) {
	kv := &kvStore{}
	kv.mu.ns = make(map[string]map[string]string)
	if dir == "" {
		return kv, nil
	}
	kv.path = filepath.Join(dir, kvFileName)
	f, err := os.Open(kv.path)
	if errors.Is(err, os.ErrNotExist) {
		return kv, nil
	}
	if err != nil {
		return nil, fmt.Errorf("namesrv: open KV config: %w", err)
	}
	defer f.Close() //nolint:errcheck // read-only
	b, err := io.ReadAll(io.LimitReader(f, maxKVFile+1))
	if err != nil {
		return nil, fmt.Errorf("namesrv: read KV config %s: %w", kv.path, err)
	}
	if len(b) > maxKVFile {
		return nil, fmt.Errorf("namesrv: KV config %s larger than %d bytes", kv.path, maxKVFile)
	}
	if len(b) == 0 {
		return kv, nil
	}
	norm, err := protocol.NormalizeJSON(nil, b)
	if err != nil {
		return nil, fmt.Errorf("namesrv: KV config %s: %w", kv.path, err)
	}
	var w kvFile
	if err := json.Unmarshal(norm, &w); err != nil {
		return nil, fmt.Errorf("namesrv: KV config %s: %w", kv.path, err)
	}
	for ns, t := range w.ConfigTable {
		if len(t) == 0 {
			continue
		}
		kv.mu.ns[ns] = t
		kv.mu.n += len(t)
	}
	return kv, nil
}

// get returns the value of key in namespace ns.
func (kv *kvStore) get(ns, key string) (string, bool) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	v, ok := kv.mu.ns[ns][key]
	return v, ok
}

// list returns a copy of namespace ns (nil when empty).
func (kv *kvStore) list(ns string) map[string]string {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	t := kv.mu.ns[ns]
	if len(t) == 0 {
		return nil
	}
	return maps.Clone(t)
}

// put sets key in namespace ns and persists; on a persistence failure the
// change is undone.
func (kv *kvStore) put(ns, key, value string) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	t := kv.mu.ns[ns]
	old, had := t[key]
	if had && old == value {
		return nil
	}
	if !had && kv.mu.n >= MaxKVEntries {
		return fmt.Errorf("%w: %d entries", ErrKVFull, MaxKVEntries)
	}
	if t == nil {
		t = make(map[string]string)
		kv.mu.ns[ns] = t
	}
	t[key] = value
	if !had {
		kv.mu.n++
	}
	if err := kv.persistLocked(); err != nil {
		if had {
			t[key] = old
		} else {
			kv.deleteLocked(ns, key)
		}
		return err
	}
	return nil
}

// delete removes key from namespace ns and persists; on a persistence
// failure the change is undone.
func (kv *kvStore) delete(ns, key string) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	old, had := kv.mu.ns[ns][key]
	if !had {
		return nil
	}
	kv.deleteLocked(ns, key)
	if err := kv.persistLocked(); err != nil {
		t := kv.mu.ns[ns]
		if t == nil {
			t = make(map[string]string)
			kv.mu.ns[ns] = t
		}
		t[key] = old
		kv.mu.n++
		return err
	}
	return nil
}

func (kv *kvStore) deleteLocked(ns, key string) {
	t := kv.mu.ns[ns]
	if _, ok := t[key]; !ok {
		return
	}
	delete(t, key)
	kv.mu.n--
	if len(t) == 0 {
		delete(kv.mu.ns, ns)
	}
}

// persistLocked writes the whole table to kv.path atomically: a temporary
// file in the same directory, fsync, rename, fsync of the directory.
func (kv *kvStore) persistLocked() error {
	if kv.path == "" {
		return nil
	}
	b, err := json.Marshal(kvFile{ConfigTable: kv.mu.ns})
	if err != nil {
		return fmt.Errorf("namesrv: encode KV config: %w", err)
	}
	dir := filepath.Dir(kv.path)
	f, err := os.CreateTemp(dir, kvFileName+".tmp*")
	if err != nil {
		return fmt.Errorf("namesrv: persist KV config: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, kv.path)
	}
	if err != nil {
		_ = os.Remove(tmp) // best effort; the error below is what matters
		return fmt.Errorf("namesrv: persist KV config: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		serr := d.Sync()
		_ = d.Close() // read-only handle
		if serr != nil {
			return fmt.Errorf("namesrv: sync KV config dir: %w", serr)
		}
	} else {
		return fmt.Errorf("namesrv: sync KV config dir: %w", err)
	}
	return nil
}

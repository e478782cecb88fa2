package ratelimitenv

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// settingsVars are the envconfig names of envoyproxy/ratelimit's src/settings/settings.go
// (commit f2fb15770f7fd1c88ca6c3a1b58ee513917ace96), in its order, with a value each is valid with.
var settingsVars = [][2]string{
	{"HOST", "127.0.0.1"}, {"PORT", "8080"}, {"DEBUG_HOST", "127.0.0.1"}, {"DEBUG_PORT", "6070"},
	{"GRPC_UDS", "/tmp/rl.sock"}, {"GRPC_HOST", "0.0.0.0"}, {"GRPC_PORT", "8081"},
	{"GRPC_MAX_CONNECTION_AGE", "1h"}, {"GRPC_MAX_CONNECTION_AGE_GRACE", "1m"},
	{"GRPC_SERVER_USE_TLS", "false"}, {"GRPC_SERVER_TLS_CERT", "/c"}, {"GRPC_SERVER_TLS_KEY", "/k"},
	{"GRPC_CLIENT_TLS_CACERT", "/ca"}, {"GRPC_CLIENT_TLS_SAN", "san"},
	{"LOG_LEVEL", "debug"}, {"LOG_FORMAT", "json"},
	{"CONFIG_TYPE", "FILE"}, {"FORCE_START_WITHOUT_INITIAL_CONFIG", "true"},
	{"CONFIG_GRPC_XDS_NODE_ID", "n"}, {"CONFIG_GRPC_XDS_NODE_METADATA", "a=b"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "x:1"}, {"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s"},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b"}, {"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"}, {"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"}, {"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "san"},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"}, {"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "10s"},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5"}, {"XDS_CLIENT_BACKOFF_JITTER", "true"},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1000000"},
	{"USE_DOG_STATSD", "false"}, {"USE_DOG_STATSD_MOGRIFIERS", "A"}, {"USE_STATSD", "true"},
	{"STATSD_HOST", "h"}, {"STATSD_PORT", "9125"}, {"EXTRA_TAGS", "a:b"}, {"STATS_FLUSH_INTERVAL", "10s"},
	{"DISABLE_STATS", "false"}, {"USE_PROMETHEUS", "true"}, {"PROMETHEUS_ADDR", ":19001"},
	{"PROMETHEUS_PATH", "/metrics"}, {"PROMETHEUS_MAPPER_YAML", "/m.yaml"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"},
	{"RUNTIME_ROOT", "/data"}, {"RUNTIME_SUBDIRECTORY", "ratelimit"}, {"RUNTIME_APPDIRECTORY", "config"},
	{"RUNTIME_IGNOREDOTFILES", "true"}, {"RUNTIME_WATCH_ROOT", "false"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "300"}, {"LOCAL_CACHE_SIZE_IN_BYTES", "1048576"},
	{"NEAR_LIMIT_RATIO", "0.9"}, {"CACHE_KEY_PREFIX", "p_"}, {"BACKEND_TYPE", "redis"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "true"}, {"LIMIT_LIMIT_HEADER", "X-Limit"},
	{"LIMIT_REMAINING_HEADER", "X-Remaining"}, {"LIMIT_RESET_HEADER", "X-Reset"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"},
	{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_TYPE", "single"}, {"REDIS_URL", "redis:6379"},
	{"REDIS_POOL_SIZE", "20"}, {"REDIS_AUTH", "secret"}, {"REDIS_TLS", "true"},
	{"REDIS_TLS_CLIENT_CERT", "/c"}, {"REDIS_TLS_CLIENT_KEY", "/k"}, {"REDIS_TLS_CACERT", "/ca"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"},
	{"REDIS_PIPELINE_WINDOW", "150us"}, {"REDIS_PIPELINE_LIMIT", "8"}, {"REDIS_CLUSTER_PIPELINE_PARALLELISM", "4"},
	{"REDIS_PERSECOND", "true"}, {"REDIS_PERSECOND_SOCKET_TYPE", "tcp"}, {"REDIS_PERSECOND_TYPE", "single"},
	{"REDIS_PERSECOND_URL", "r2:6379"}, {"REDIS_PERSECOND_POOL_SIZE", "10"}, {"REDIS_PERSECOND_AUTH", "s"},
	{"REDIS_PERSECOND_TLS", "false"}, {"REDIS_SENTINEL_AUTH", "s"}, {"REDIS_PERSECOND_SENTINEL_AUTH", "s"},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "0"}, {"REDIS_PERSECOND_PIPELINE_LIMIT", "0"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1"}, {"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"},
	{"REDIS_TIMEOUT", "2s"}, {"REDIS_PERSECOND_TIMEOUT", "2s"}, {"REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT"}, {"REDIS_STARTUP_INITIAL_INTERVAL", "1s"},
	{"REDIS_STARTUP_MAX_INTERVAL", "30s"}, {"REDIS_STARTUP_MAX_ELAPSED_TIME", "0"},
	{"MEMCACHE_HOST_PORT", "m:11211"}, {"MEMCACHE_MAX_IDLE_CONNS", "2"}, {"MEMCACHE_SRV", "_m._tcp"},
	{"MEMCACHE_SRV_REFRESH", "0"}, {"MEMCACHE_TLS", "false"}, {"MEMCACHE_TLS_CLIENT_CERT", "/c"},
	{"MEMCACHE_TLS_CLIENT_KEY", "/k"}, {"MEMCACHE_TLS_CACERT", "/ca"}, {"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false"},
	{"SHADOW_MODE", "true"}, {"QUOTA_MODE", "false"}, {"RESPONSE_DYNAMIC_METADATA", "true"},
	{"MERGE_DOMAIN_CONFIG", "true"},
	{"TRACING_ENABLED", "true"}, {"TRACING_SERVICE_NAME", "rl"}, {"TRACING_SERVICE_NAMESPACE", "ns"},
	{"TRACING_SERVICE_INSTANCE_ID", "i"}, {"TRACING_EXPORTER_PROTOCOL", "grpc"}, {"TRACING_SAMPLING_RATE", "0.1"},
}

// agreeing are values that ask for what rls does unless told otherwise: they are honoured by
// setting nothing.
var agreeing = []string{"GRPC_SERVER_USE_TLS=false", "CONFIG_GRPC_XDS_SERVER_USE_TLS=false", "USE_PROMETHEUS=false", "LIMIT_RESPONSE_HEADERS_ENABLED=false"}

// accounted says whether v is the source of a setting or has a notice in res.
func accounted(res Result, env []string, v string) bool {
	for _, a := range agreeing {
		if slices.Contains(env, a) && strings.HasPrefix(a, v+"=") {
			return true
		}
	}
	for _, s := range res.Settings {
		if slices.Contains(strings.Split(s.From, ", "), v) {
			return true
		}
	}
	return slices.ContainsFunc(res.Notices, func(n Notice) bool { return n.Var == v })
}

// TestEveryVariableAccounted sets each of envoyproxy/ratelimit's variables, alone beside a
// distinctive one, in each mode that decides whether it is read, and checks that it is
// translated or noticed: none is ignored in silence.
func TestEveryVariableAccounted(t *testing.T) {
	if len(settingsVars) != 114 {
		t.Fatalf("settingsVars has %d names, settings.go has 114", len(settingsVars))
	}
	bases := map[string][]string{
		"file":      {"RUNTIME_ROOT=/data", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379"},
		"xds":       {"CONFIG_TYPE=GRPC_XDS_SOTW", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379"},
		"tls":       {"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_CLIENT_TLS_CACERT=/ca", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "REDIS_TLS=true", "REDIS_TLS_CLIENT_CERT=/c", "REDIS_TLS_CLIENT_KEY=/k", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/c", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/k"},
		"sentinel":  {"REDIS_TYPE=sentinel", "REDIS_URL=m,s1:26379"},
		"cluster":   {"REDIS_TYPE=cluster", "REDIS_URL=a:7000,b:7001"},
		"prom":      {"RUNTIME_ROOT=/data", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "USE_PROMETHEUS=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true"},
		"unix sock": {"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/r.sock"},
	}
	for _, kv := range settingsVars {
		if !known[kv[0]] {
			t.Errorf("%s: not in the package's variables", kv[0])
		}
		for name, base := range bases {
			env := append(slices.Clone(base), kv[0]+"="+kv[1])
			if kv[0] == "REDIS_URL" && name != "file" {
				continue // the base sets its own
			}
			if kv[0] == "REDIS_TLS" && name == "unix sock" {
				continue // an error: tested below
			}
			if kv[0] == "GRPC_SERVER_USE_TLS" && kv[1] == "true" {
				continue
			}
			res, err := Translate(env)
			if err != nil {
				t.Errorf("%s: %s: %v", name, kv[0], err)
				continue
			}
			for _, e := range env {
				v, _, _ := strings.Cut(e, "=")
				if !accounted(res, env, v) {
					t.Errorf("%s: %s set and neither translated nor noticed", name, v)
				}
			}
			for _, n := range res.Notices {
				if n.Text == "not read by rls" {
					t.Errorf("%s: %s reached the fallback notice", name, n.Var)
				}
			}
		}
	}
	for _, v := range variables {
		if !slices.ContainsFunc(settingsVars, func(kv [2]string) bool { return kv[0] == v }) {
			t.Errorf("%s: in the package's variables, not in settings.go", v)
		}
	}
}

// TestAllAtOnce sets every variable together (with the memcache backend left off) and checks
// each is accounted for once.
func TestAllAtOnce(t *testing.T) {
	var env []string
	for _, kv := range settingsVars {
		v := kv[1]
		if kv[0] == "GRPC_SERVER_USE_TLS" {
			v = "true"
		}
		env = append(env, kv[0]+"="+v)
	}
	env = append(env, "GRPC_SERVER_TLS_CA_CERT=/ca", "DOG_STATSD_MOGRIFIER_A_PATTERN=x", "PATH=/bin", "HOME=/root")
	res, err := Translate(env)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Present) != len(env)-2 {
		t.Errorf("Present has %d names, want %d", len(res.Present), len(env)-2)
	}
	if !slices.IsSorted(res.Present) || slices.Contains(res.Present, "PATH") {
		t.Errorf("Present = %v: want sorted, without PATH", res.Present)
	}
	seen := map[string]bool{}
	for _, n := range res.Notices {
		if seen[n.Var] {
			t.Errorf("%s noticed twice", n.Var)
		}
		seen[n.Var] = true
	}
	flags := map[string]bool{}
	for _, s := range res.Settings {
		if flags[s.Flag] {
			t.Errorf("flag %s set twice", s.Flag)
		}
		flags[s.Flag] = true
	}
	for _, v := range res.Present {
		if !accounted(res, env, v) {
			t.Errorf("%s neither translated nor noticed", v)
		}
	}
	for _, n := range res.Notices {
		if strings.Contains(n.Text, "secret") {
			t.Errorf("%s: notice shows a password: %s", n.Var, n.Text)
		}
	}
}

// TestEnvoyGateway is the environment Envoy Gateway gives its rate-limit deployment.
func TestEnvoyGateway(t *testing.T) {
	env := []string{
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=true", "STATSD_PORT=9125", "CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key",
		"GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt", "CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis.redis.svc:6379",
		"HOSTNAME=envoy-ratelimit-5d8f", "KUBERNETES_SERVICE_HOST=10.96.0.1",
	}
	res, err := Translate(env)
	if err != nil {
		t.Fatal(err)
	}
	want := []Setting{
		{"grpc-addr", "0.0.0.0:8081", "default of GRPC_HOST, GRPC_PORT"},
		{"http-addr", "0.0.0.0:8080", "default of HOST, PORT"},
		{"log-level", "info", "LOG_LEVEL"},
		{"xds-server", "envoy-gateway:18001", "CONFIG_TYPE, CONFIG_GRPC_XDS_SERVER_URL"},
		{"xds-node-id", "envoy-ratelimit", "CONFIG_GRPC_XDS_NODE_ID"},
		{"xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS"},
		{"xds-tls-cert", "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"},
		{"xds-tls-key", "/certs/tls.key", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"},
		{"xds-tls-ca", "/certs/ca.crt", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"},
		{"start-without-rules", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG"},
		{"backend", "redis", "default of BACKEND_TYPE"},
		{"redis-url", "redis://redis.redis.svc:6379", "REDIS_SOCKET_TYPE, REDIS_URL"},
		{"grpc-tls-cert", "/certs/tls.crt", "GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT"},
		{"grpc-tls-key", "/certs/tls.key", "GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_KEY"},
		{"grpc-tls-client-ca", "/certs/ca.crt", "GRPC_SERVER_TLS_CA_CERT"},
		{"grpc-max-connection-age", "24h0m0s", "default of GRPC_MAX_CONNECTION_AGE"},
		{"grpc-max-connection-age-grace", "1h0m0s", "default of GRPC_MAX_CONNECTION_AGE_GRACE"},
		{"statsd-addr", "localhost:9125", "USE_STATSD, STATSD_PORT"},
		{"statsd-flush-interval", "10s", "default of STATS_FLUSH_INTERVAL"},
	}
	if !reflect.DeepEqual(res.Settings, want) {
		t.Errorf("settings:\n got %v\nwant %v", res.Settings, want)
	}
	var noticed []string
	for _, n := range res.Notices {
		noticed = append(noticed, n.Var)
	}
	wantNoticed := []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT",
		"USE_STATSD"}
	if !reflect.DeepEqual(noticed, wantNoticed) {
		t.Errorf("notices for %v, want %v", noticed, wantNoticed)
	}
	if len(res.Present) != len(env)-2 || slices.Contains(res.Present, "HOSTNAME") {
		t.Errorf("Present = %v", res.Present)
	}
}

func TestNotPresent(t *testing.T) {
	for _, env := range [][]string{
		nil,
		{"HOST=0.0.0.0", "PORT=8080", "LOG_LEVEL=debug", "REDIS_URL=redis://cache:6379", "REDIS_AUTH=x", "GRPC_PORT=1"},
		{"CONFIG_TYPE=", "RUNTIME_ROOT="}, // empty counts as unset
		{"RLS_BACKEND=redis", "PATH=/bin"},
	} {
		res, err := Translate(env)
		if err != nil || !reflect.DeepEqual(res, Result{}) {
			t.Errorf("%v: got %+v, %v; want the zero Result", env, res, err)
		}
	}
}

// setting returns the value of flag in res, and whether it is there.
func setting(res Result, flag string) (string, bool) {
	for _, s := range res.Settings {
		if s.Flag == flag {
			return s.Value, true
		}
	}
	return "", false
}

func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want map[string]string // flag: value; "" means absent
	}{
		{"file defaults", []string{"USE_STATSD=false"}, map[string]string{
			"config": "/srv/runtime_data/current/config", "config-all-files": "true", "config-dot-files": "true",
			"backend": "redis", "redis-url": "unix:///var/run/nutcracker/ratelimit.sock", "log-level": "",
			"debug-addr": "", "http-addr": "0.0.0.0:8080", "grpc-addr": "0.0.0.0:8081",
			"xds-server": "", "metrics-addr": "", "log-format": "", "redis-local-cache-size": "",
		}},
		{"runtime dirs", []string{"RUNTIME_ROOT=/data/", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=rules", "RUNTIME_IGNOREDOTFILES=TRUE", "RUNTIME_WATCH_ROOT=true"},
			map[string]string{"config": "/data/ratelimit/rules", "config-dot-files": "false"}},
		{"config type lower case", []string{"CONFIG_TYPE=file"}, map[string]string{"config": "/srv/runtime_data/current/config"}},
		{"ipv6 hosts", []string{"BACKEND_TYPE=redis", "HOST=::", "PORT=9000", "GRPC_HOST=[::1]", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0x10"},
			map[string]string{"http-addr": "[::]:9000", "grpc-addr": "[::1]:8081", "debug-addr": "127.0.0.1:16"}},
		{"debug port alone stays on loopback", []string{"USE_STATSD=1", "DEBUG_PORT=7000"}, map[string]string{"debug-addr": "127.0.0.1:7000"}},
		{"debug host asked for", []string{"USE_STATSD=1", "DEBUG_HOST=0.0.0.0"}, map[string]string{"debug-addr": "0.0.0.0:6070"}},
		{"log levels", []string{"USE_STATSD=1", "LOG_LEVEL=Trace", "LOG_FORMAT=JSON"}, map[string]string{"log-level": "debug", "log-format": "json"}},
		{"log fatal", []string{"USE_STATSD=1", "LOG_LEVEL=fatal", "LOG_FORMAT=logfmt"}, map[string]string{"log-level": "error", "log-format": "text"}},
		{"tcp with auth", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_AUTH=p@ss:w/rd"},
			map[string]string{"redis-url": "redis://p%40ss:w%2Frd@redis:6379"}},
		{"tcp with password only", []string{"REDIS_SOCKET_TYPE=TCP", "REDIS_URL=10.0.0.1:6379", "REDIS_AUTH=pa ss", "REDIS_TLS=true"},
			map[string]string{"redis-url": "rediss://:pa%20ss@10.0.0.1:6379"}},
		{"tcp ipv6", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=[::1]:6379"}, map[string]string{"redis-url": "redis://[::1]:6379"}},
		{"unix with auth", []string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/run/redis.sock", "REDIS_AUTH=u:p"},
			map[string]string{"redis-url": "unix://u:p@/run/redis.sock"}},
		{"url passes through", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis://r:6379/2"}, map[string]string{"redis-url": "redis://r:6379/2"}},
		{"url with tls and auth", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis://r:6379", "REDIS_TLS=true", "REDIS_AUTH=pw", "REDIS_TLS_CACERT=/ca.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"},
			map[string]string{"redis-url": "rediss://:pw@r:6379", "redis-tls-ca": "/ca.pem", "redis-tls-skip-hostname-verify": "true"}},
		{"rediss url", []string{"REDIS_TYPE=SINGLE", "REDIS_URL=rediss://r:6380", "REDIS_TLS_CLIENT_CERT=/c", "REDIS_TLS_CLIENT_KEY=/k"},
			map[string]string{"redis-url": "rediss://r:6380", "redis-tls-cert": "/c", "redis-tls-key": "/k"}},
		{"tls files without tls", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "REDIS_TLS_CACERT=/ca"},
			map[string]string{"redis-url": "redis://r:6379", "redis-tls-ca": ""}},
		{"sentinel", []string{"REDIS_TYPE=Sentinel", "REDIS_URL=mymaster,s1:26379,s2:26379", "REDIS_AUTH=u:p", "REDIS_SENTINEL_AUTH=su:s&p"},
			map[string]string{"redis-url": "redis-sentinel://u:p@s1:26379,s2:26379/mymaster?sentinel_password=s%26p&sentinel_username=su"}},
		{"sentinel tls password only", []string{"REDIS_TYPE=sentinel", "REDIS_URL=m,s1:26379", "REDIS_TLS=true", "REDIS_SENTINEL_AUTH=sp"},
			map[string]string{"redis-url": "rediss-sentinel://s1:26379/m?sentinel_password=sp"}},
		{"cluster", []string{"REDIS_TYPE=cluster", "REDIS_URL=a:7000,b:7001", "REDIS_AUTH=pw", "REDIS_SOCKET_TYPE=unix"},
			map[string]string{"redis-url": "redis-cluster://:pw@a:7000,b:7001"}},
		{"redis tuning", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "REDIS_POOL_SIZE=50", "REDIS_TIMEOUT=250ms", "CACHE_KEY_PREFIX=rl_", "LOCAL_CACHE_SIZE_IN_BYTES=1048576"},
			map[string]string{"redis-pool-size": "50", "redis-dial-timeout": "250ms", "redis-read-timeout": "250ms", "redis-key-prefix": "rl_", "redis-local-cache-size": "8192"}},
		{"local cache off", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "LOCAL_CACHE_SIZE_IN_BYTES=0", "REDIS_TIMEOUT=0s"},
			map[string]string{"redis-local-cache-size": "0", "redis-dial-timeout": ""}},
		{"local cache tiny", []string{"LOCAL_CACHE_SIZE_IN_BYTES=100"}, map[string]string{"redis-local-cache-size": "1"}},
		{"modes", []string{"USE_STATSD=false", "NEAR_LIMIT_RATIO=0.5", "SHADOW_MODE=true", "QUOTA_MODE=0", "MERGE_DOMAIN_CONFIG=t", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true", "FORCE_START_WITHOUT_INITIAL_CONFIG=false"},
			map[string]string{"near-limit-ratio": "0.5", "shadow-mode": "true", "quota-mode": "false", "merge-domains": "true", "ready-with-rules": "true", "start-without-rules": "false"}},
		{"xds", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA=a=b,c=d=e", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer x=,x-a:1",
			"CONFIG_GRPC_XDS_SERVER_TLS_SAN=cp.example", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=500ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=30s", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=8388608"},
			map[string]string{"xds-server": "localhost:18000", "xds-node-id": "default", "xds-node-metadata": "a=b,c=d=e",
				"xds-header": "authorization=Bearer x=,x-a=1", "xds-tls": "", "xds-tls-server-name": "", "xds-backoff-initial": "500ms",
				"xds-backoff-max": "30s", "xds-max-msg-size": "8388608", "config": ""}},
		{"xds metadata partly invalid", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA=key1:val1,key2=val2"},
			map[string]string{"xds-node-metadata": "key2=val2"}},
		{"grpc mtls", []string{"USE_STATSD=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_CLIENT_TLS_CACERT=/ca", "GRPC_CLIENT_TLS_SAN=envoy", "GRPC_MAX_CONNECTION_AGE=5m", "GRPC_MAX_CONNECTION_AGE_GRACE=0s"},
			map[string]string{"grpc-tls-cert": "/c", "grpc-tls-key": "/k", "grpc-tls-client-ca": "/ca", "grpc-tls-client-san": "envoy",
				"grpc-max-connection-age": "5m0s", "grpc-max-connection-age-grace": "0s"}},
		{"grpc mtls, envoy gateway's name", []string{"USE_STATSD=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_SERVER_TLS_CA_CERT=/eg-ca", "GRPC_CLIENT_TLS_SAN=envoy"},
			map[string]string{"grpc-tls-client-ca": "/eg-ca", "grpc-tls-client-san": "envoy"}},
		{"grpc mtls, both names alike", []string{"USE_STATSD=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_SERVER_TLS_CA_CERT=/ca", "GRPC_CLIENT_TLS_CACERT=/ca"},
			map[string]string{"grpc-tls-client-ca": "/ca"}},
		{"grpc mtls, both names differ", []string{"USE_STATSD=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_SERVER_TLS_CA_CERT=/eg-ca", "GRPC_CLIENT_TLS_CACERT=/own-ca"},
			map[string]string{"grpc-tls-client-ca": "/own-ca"}},
		{"grpc tls off", []string{"USE_STATSD=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_SERVER_TLS_CA_CERT=/ca"}, map[string]string{"grpc-tls-cert": "", "grpc-tls-client-ca": ""}},
		{"prometheus", []string{"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001"},
			map[string]string{"metrics-addr": ":19001", "metrics-path": "/metrics"}},
		{"prometheus off", []string{"USE_STATSD=true", "PROMETHEUS_ADDR=:19001"}, map[string]string{"metrics-addr": ""}},
		{"headers", []string{"USE_STATSD=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_RESET_HEADER=X-RateLimit-Reset"},
			map[string]string{"response-headers": "legacy", "response-header-reset": "X-RateLimit-Reset", "response-header-limit": ""}},
		{"headers off", []string{"USE_STATSD=true", "LIMIT_LIMIT_HEADER=X-L"}, map[string]string{"response-headers": "", "response-header-limit": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Translate(tc.env)
			if err != nil {
				t.Fatal(err)
			}
			for flag, want := range tc.want {
				got, ok := setting(res, flag)
				if want == "" && ok {
					t.Errorf("--%s=%q, want none", flag, got)
				} else if want != "" && got != want {
					t.Errorf("--%s=%q, want %q", flag, got, want)
				}
			}
			for _, e := range tc.env {
				if v, _, _ := strings.Cut(e, "="); !accounted(res, tc.env, v) {
					t.Errorf("%s neither translated nor noticed", v)
				}
			}
		})
	}
}

func TestNotices(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want map[string]string // variable: a part of its notice
	}{
		{"tls files without tls", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "REDIS_TLS_CACERT=/ca"}, map[string]string{"REDIS_TLS_CACERT": "REDIS_TLS is not true"}},
		{"redis timeout", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "REDIS_TIMEOUT=1s"}, map[string]string{"REDIS_TIMEOUT": "--redis-timeout (default 50ms)"}},
		{"key prefix", []string{"USE_STATSD=true", "CACHE_KEY_PREFIX=x"}, map[string]string{"CACHE_KEY_PREFIX": "do not carry over"}},
		{"local cache", []string{"LOCAL_CACHE_SIZE_IN_BYTES=1280"}, map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1280 bytes at about 128 bytes per key is 10 keys"}},
		{"per second", []string{"REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=r2:6379", "REDIS_PERSECOND_AUTH=secret"},
			map[string]string{"REDIS_PERSECOND": "the one Redis", "REDIS_PERSECOND_URL": "the one Redis", "REDIS_PERSECOND_AUTH": "the one Redis"}},
		{"memcache vars with redis", []string{"MEMCACHE_HOST_PORT=m:11211"}, map[string]string{"MEMCACHE_HOST_PORT": "no memcache backend"}},
		{"statsd", []string{"USE_STATSD=true", "STATSD_HOST=s", "DOG_STATSD_MOGRIFIER_X_PATTERN=p"}, map[string]string{"USE_STATSD": "UDP", "DOG_STATSD_MOGRIFIER_X_PATTERN": "not used"}},
		{"statsd off", []string{"USE_STATSD=false", "STATSD_HOST=s", "EXTRA_TAGS=a:b"}, map[string]string{"STATSD_HOST": "sends no statsd", "EXTRA_TAGS": "sends no statsd"}},
		{"stats disabled", []string{"USE_STATSD=true", "DISABLE_STATS=true"}, map[string]string{"DISABLE_STATS": "sends no statsd", "USE_STATSD": "not used"}},
		{"pipeline", []string{"USE_STATSD=true", "REDIS_PIPELINE_WINDOW=150us", "REDIS_PIPELINE_LIMIT=8"}, map[string]string{"REDIS_PIPELINE_WINDOW": "--redis-coalesce", "REDIS_PIPELINE_LIMIT": "--redis-coalesce"}},
		{"stop increment", []string{"USE_STATSD=true", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false"}, map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "never charges a denied request"}},
		{"tracing", []string{"USE_STATSD=true", "TRACING_ENABLED=true"}, map[string]string{"TRACING_ENABLED": "OTEL_EXPORTER_OTLP_ENDPOINT"}},
		{"uds", []string{"USE_STATSD=true", "GRPC_UDS=/tmp/s"}, map[string]string{"GRPC_UDS": "TCP only"}},
		{"watch root", []string{"RUNTIME_ROOT=/d", "RUNTIME_WATCH_ROOT=true"}, map[string]string{"RUNTIME_WATCH_ROOT": "/d/config"}},
		{"xds vars in file mode", []string{"CONFIG_GRPC_XDS_SERVER_URL=x:1"}, map[string]string{"CONFIG_GRPC_XDS_SERVER_URL": "CONFIG_TYPE is FILE"}},
		{"xds backoff", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_JITTER=false", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=1s"},
			map[string]string{"XDS_CLIENT_BACKOFF_JITTER": "jittered exponential backoff", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "jittered exponential backoff"}},
		{"metadata dropped", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA=k:v,a=b"}, map[string]string{"CONFIG_GRPC_XDS_NODE_METADATA": `"k:v"`}},
		{"sentinel auth without sentinel", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:1", "REDIS_SENTINEL_AUTH=secret"}, map[string]string{"REDIS_SENTINEL_AUTH": "not sentinel"}},
		{"socket type with cluster", []string{"REDIS_TYPE=cluster", "REDIS_URL=a:1", "REDIS_SOCKET_TYPE=unix"}, map[string]string{"REDIS_SOCKET_TYPE": "over TCP"}},
		{"ca cert name without tls", []string{"USE_STATSD=true", "GRPC_SERVER_TLS_CA_CERT=/ca"}, map[string]string{"GRPC_SERVER_TLS_CA_CERT": "plaintext"}},
		{"both ca cert names", []string{"USE_STATSD=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_SERVER_TLS_CA_CERT=/eg-ca", "GRPC_CLIENT_TLS_CACERT=/own-ca"},
			map[string]string{"GRPC_SERVER_TLS_CA_CERT": "GRPC_CLIENT_TLS_CACERT is set too, to another file, and wins: client certificates are verified against /own-ca"}},
		{"dynamic metadata", []string{"USE_STATSD=true", "RESPONSE_DYNAMIC_METADATA=true"}, map[string]string{"RESPONSE_DYNAMIC_METADATA": "dynamic_metadata"}},
		{"expiration jitter", []string{"USE_STATSD=true", "EXPIRATION_JITTER_MAX_SECONDS=300"}, map[string]string{"EXPIRATION_JITTER_MAX_SECONDS": "fixed_window keys expire together"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Translate(tc.env)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, n := range res.Notices {
				got[n.Var] = n.Text
				if strings.Contains(n.Text, "secret") {
					t.Errorf("%s: notice shows a password: %s", n.Var, n.Text)
				}
			}
			for v, part := range tc.want {
				if !strings.Contains(got[v], part) {
					t.Errorf("%s: notice %q, want it to say %q", v, got[v], part)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want []string // parts of the error
	}{
		{"memcache", []string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=m:11211"}, []string{`BACKEND_TYPE="memcache"`, "no memcache backend", "BACKEND_TYPE=redis", "--backend memory"}},
		{"backend", []string{"BACKEND_TYPE=etcd"}, []string{`BACKEND_TYPE="etcd": want redis`}},
		{"config type", []string{"CONFIG_TYPE=GRPC_XDS_DELTA"}, []string{`CONFIG_TYPE="GRPC_XDS_DELTA": want FILE or GRPC_XDS_SOTW`}},
		{"bool", []string{"SHADOW_MODE=yes", "USE_STATSD=true"}, []string{`SHADOW_MODE="yes": want true or false`}},
		{"port", []string{"USE_STATSD=true", "PORT=80a", "GRPC_PORT=70000"}, []string{`PORT="80a": want a whole number from 0 to 65535`, `GRPC_PORT="70000"`}},
		{"duration", []string{"USE_STATSD=true", "GRPC_MAX_CONNECTION_AGE=1 day", "REDIS_TIMEOUT=-1s"}, []string{`GRPC_MAX_CONNECTION_AGE="1 day": want a duration`, `REDIS_TIMEOUT="-1s"`}},
		{"log level", []string{"USE_STATSD=true", "LOG_LEVEL=verbose"}, []string{`LOG_LEVEL="verbose": want trace, debug`}},
		{"redis type", []string{"REDIS_TYPE=ring"}, []string{`REDIS_TYPE="ring": want single, sentinel or cluster`}},
		{"socket type", []string{"REDIS_SOCKET_TYPE=udp"}, []string{`REDIS_SOCKET_TYPE="udp": want tcp or unix`}},
		{"tcp without port", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis", "REDIS_AUTH=secret"}, []string{`REDIS_URL="redis": REDIS_SOCKET_TYPE is tcp: want host:port`}},
		{"tcp with the default url", []string{"REDIS_SOCKET_TYPE=tcp"}, []string{`REDIS_URL (not set: its default "/var/run/nutcracker/ratelimit.sock"): REDIS_SOCKET_TYPE is tcp: want host:port`}},
		{"unix relative", []string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=redis:6379"}, []string{`REDIS_URL="redis:6379": REDIS_SOCKET_TYPE is unix (its default)`, "REDIS_SOCKET_TYPE=tcp"}},
		{"unix with tls", []string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/r.sock", "REDIS_TLS=true"}, []string{`REDIS_TLS="true": rls uses no TLS on a unix socket`}},
		{"url scheme", []string{"REDIS_TYPE=single", "REDIS_URL=http://u:secret@r:6379"}, []string{`REDIS_URL="http://u:xxx@r:6379": want host:port`}},
		{"sentinel format", []string{"REDIS_TYPE=sentinel", "REDIS_URL=s1:26379,s2:26379", "REDIS_AUTH=secret"}, []string{`REDIS_URL="s1:26379,s2:26379": REDIS_TYPE is sentinel: want the master name then the sentinels`}},
		{"sentinel one part", []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster"}, []string{"want the master name"}},
		{"cluster format", []string{"REDIS_TYPE=cluster", "REDIS_URL=redis-cluster://a:1"}, []string{"REDIS_TYPE is cluster: want the seed nodes"}},
		{"headers syntax", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization=secret"}, []string{`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS="xxx": item 1 is not name:value`}},
		{"grpc tls without cert", []string{"USE_STATSD=true", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_KEY=/k"}, []string{"GRPC_SERVER_USE_TLS=\"true\": needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"}},
		{"redis cert without key", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:1", "REDIS_TLS=true", "REDIS_TLS_CLIENT_CERT=/c"}, []string{`REDIS_TLS_CLIENT_CERT="/c": needs REDIS_TLS_CLIENT_KEY`}},
		{"near limit", []string{"NEAR_LIMIT_RATIO=80", "USE_STATSD=true"}, []string{`NEAR_LIMIT_RATIO="80": want a number from 0 to 1`}},
		{"near limit NaN", []string{"NEAR_LIMIT_RATIO=NaN", "USE_STATSD=true"}, []string{`NEAR_LIMIT_RATIO="NaN": want a number from 0 to 1`}},
		{"local cache", []string{"LOCAL_CACHE_SIZE_IN_BYTES=-1"}, []string{`LOCAL_CACHE_SIZE_IN_BYTES="-1"`}},
		{"header name", []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_LIMIT_HEADER=X Limit"}, []string{`LIMIT_LIMIT_HEADER="X Limit": want an HTTP header name`}},
		{"prometheus path", []string{"USE_PROMETHEUS=true", "USE_STATSD=false", "PROMETHEUS_PATH=metrics"}, []string{`PROMETHEUS_PATH="metrics": want a path starting with /`}},
		{"backoff order", []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=1m", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=10s"}, []string{"want at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Translate(tc.env)
			if err == nil {
				t.Fatalf("no error; settings %v", res.Settings)
			}
			for _, part := range tc.want {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q does not say %q", err, part)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows a password: %q", err)
			}
			if res.Settings != nil || res.Notices != nil || len(res.Present) == 0 {
				t.Errorf("on error got %+v, want Present only", res)
			}
		})
	}
}

func TestDisplay(t *testing.T) {
	for _, tc := range []struct {
		s    Setting
		want string
	}{
		{Setting{Flag: "redis-url", Value: "redis://:p%40ss@r:6379"}, "redis://:xxx@r:6379"},
		{Setting{Flag: "redis-url", Value: "unix://u:p@/run/r.sock"}, "unix://u:xxx@/run/r.sock"},
		{Setting{Flag: "redis-url", Value: "redis-sentinel://u:p@s1:1,s2:2/m?sentinel_password=sp&sentinel_username=su"},
			"redis-sentinel://u:xxx@s1:1,s2:2/m?sentinel_password=xxx&sentinel_username=su"},
		{Setting{Flag: "redis-url", Value: "redis://r:6379"}, "redis://r:6379"},
		{Setting{Flag: "xds-header", Value: "authorization=Bearer t,x-a=1"}, "authorization=xxx,x-a=xxx"},
		{Setting{Flag: "config", Value: "/data/a:b@c"}, "/data/a:b@c"},
	} {
		if got := tc.s.Display(); got != tc.want {
			t.Errorf("%s %q: Display %q, want %q", tc.s.Flag, tc.s.Value, got, tc.want)
		}
	}
}

// TestFirstOfRepeatedNameCounts: the process sees the first of a repeated name.
func TestFirstOfRepeatedNameCounts(t *testing.T) {
	res, err := Translate([]string{"USE_STATSD=true", "LOG_LEVEL=debug", "LOG_LEVEL=error"})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := setting(res, "log-level"); v != "debug" {
		t.Errorf("log-level %q, want debug", v)
	}
}

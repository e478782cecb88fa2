package redistest

import (
	"context"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ScriptRuns is how many script calls the Redis behind c has run: FCALL, EVALSHA and EVAL from
// INFO commandstats, their calls less their failed_calls. Redis 7.0 counts a call that found no
// script (NOSCRIPT) or no function ("Function not found") in both calls and failed_calls, and
// one refused before it ran (rejected_calls: MOVED, CLUSTERDOWN) in neither: such calls ran
// nothing. A replica counts none: Redis 7 replicates a script's effects, not the script.
func ScriptRuns(ctx context.Context, c *goredis.Client) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var runs int64
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_fcall" && name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				runs += n
			case "failed_calls":
				runs -= n
			}
		}
	}
	return runs, nil
}

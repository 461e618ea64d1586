package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// What a run costs the PostgreSQL server (Config.Source "wal", on the private server the
// bench starts): CPU time of its processes, and the statements it runs while the outbox
// is idle.

// userHZ is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, 100 on Linux.
const userHZ = 100

// pgCPU reads the CPU time of a PostgreSQL server's processes: the postmaster and its
// children (backends, the walsender, the background workers), from /proc.
type pgCPU struct {
	postmaster int
}

// cpuTimes maps each of the server's processes to its CPU time so far, and says which
// are walsenders (their process title starts "postgres: walsender").
type cpuTimes map[int]procCPU

type procCPU struct {
	cpu       time.Duration
	walsender bool
}

func (c *pgCPU) sample() (cpuTimes, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := cpuTimes{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, cpu, ok := readStat(pid)
		if !ok || (pid != c.postmaster && ppid != c.postmaster) {
			continue
		}
		title, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[pid] = procCPU{cpu: cpu, walsender: strings.HasPrefix(string(title), "postgres: walsender")}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no process of the PostgreSQL server (postmaster %d) in /proc", c.postmaster)
	}
	return out, nil
}

// since returns the CPU time the server's processes used from before to now: each
// process alive now counts from its time in before (from 0 if it started since); one
// that ended since is lost, as /proc keeps nothing of it.
func (now cpuTimes) since(before cpuTimes) (all, walsender time.Duration) {
	for pid, p := range now {
		d := p.cpu - before[pid].cpu
		if d < 0 { // a new process under a reused pid
			d = p.cpu
		}
		all += d
		if p.walsender {
			walsender += d
		}
	}
	return all, walsender
}

// hostCPU is a sample of the bench process's CPU time (the relays run in it) and of the
// whole machine's busy time, from /proc.
type hostCPU struct {
	at   time.Time
	self time.Duration // the bench process: user + system
	busy time.Duration // every CPU of the machine, not idle and not waiting for I/O
}

// busyCores is how many CPUs were busy on average from before to h.
func (h hostCPU) busyCores(before hostCPU) float64 {
	return float64(h.busy-before.busy) / float64(max(h.at.Sub(before.at), 1))
}

func sampleHost() (hostCPU, error) {
	_, self, ok := readStat(os.Getpid())
	if !ok {
		return hostCPU{}, errors.New("read /proc/self/stat")
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}, err
	}
	// "cpu  user nice system idle iowait irq softirq steal ...", in USER_HZ ticks.
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return hostCPU{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks int64
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return hostCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
		if i != 3 && i != 4 { // idle, iowait
			ticks += n
		}
	}
	return hostCPU{at: time.Now(), self: self, busy: time.Duration(ticks) * time.Second / userHZ}, nil
}

// readStat reads a process's parent and its CPU time (user + system) from
// /proc/<pid>/stat.
func readStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold spaces: the fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is the state (field 3), so field n is f[n-3]: ppid 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	utime, err2 := strconv.ParseInt(f[11], 10, 64)
	stime, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return ppid, time.Duration(utime+stime) * time.Second / userHZ, true
}

// statementCounts returns the statements run in the pool's database so far, and those of
// them that fetch messages, from pg_stat_statements (the bench's private server loads
// it). A fetch is the statement that reads due messages in seq order; lease rounds,
// outcomes and the bench's own queries are the others.
func statementCounts(ctx context.Context, pool *pgxpool.Pool) (all, fetches int64, err error) {
	err = pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint,
       coalesce(sum(calls) FILTER (WHERE query LIKE '%ORDER BY o.seq%LIMIT%'), 0)::bigint
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_statements%'`).Scan(&all, &fetches)
	return all, fetches, err
}

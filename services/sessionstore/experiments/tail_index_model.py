# A model, not a bench of omicos: SQLite's own WAL frames and CPU per event
# for the event log written straight into its keyed table (`direct`) against
# the tail as the writer now keeps it (`tail`: rows appended in arrival
# order with AUTOINCREMENT positions, known per session in memory; once
# MOVE live rows are there, steps of up to 256 rows copy sessions into the
# keyed table by position, `pos IN (json_each(...))`, and the move's end
# deletes the tail by a range of positions). S sessions write 86 events each;
# every tick each writes one, in transactions of 15 events from 15 random
# sessions (1,000 slow streams of the load bench). Python's per-statement
# cost is in every figure.
# Usage: python3 tail_index_model.py direct|tail S [MOVE]
# (docs/benchmarks.md, 2026-12-04: 1,000 sessions, 1.49 frames/event direct,
# 0.43 tail at MOVE=16384)
import sqlite3, os, random, time, json, sys, uuid
mode = sys.argv[1]; S = int(sys.argv[2]); MOVE = int(sys.argv[3]) if len(sys.argv)>3 else 16384
path = f"/tmp/omicos-tail-index-model-{mode}.db"
for ext in ("", "-wal", "-shm"):
    try: os.remove(path+ext)
    except FileNotFoundError: pass
c = sqlite3.connect(path, isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=NORMAL"); c.execute("PRAGMA wal_autocheckpoint=0")
c.execute("CREATE TABLE ev (session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY(session_id, seq))")
c.execute("CREATE TABLE tail (pos INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL)")
sess = [str(uuid.uuid4()) for _ in range(S)]
seq = {s: 0 for s in sess}
body = os.urandom(120)
idx = {}  # session -> list of (pos, seq)
def frames(): return (os.path.getsize(path+"-wal")-32)//4120 if os.path.exists(path+"-wal") else 0
f0 = frames(); t0 = time.process_time(); n = 0
cycle_max = None; order = []; step_i = 0
def step():
    global cycle_max, order, step_i
    if cycle_max is None:
        if sum(len(v) for v in idx.values()) < MOVE: return
        cycle_max = c.execute("SELECT max(pos) FROM tail").fetchone()[0]; order = sorted(idx); step_i = 0
    take = []; 
    while step_i < len(order) and len(take) < 256:
        s = order[step_i]; step_i += 1
        take += [p for p, _ in idx.pop(s, [])]
    c.execute("BEGIN IMMEDIATE")
    if take:
        c.execute("INSERT INTO ev SELECT session_id, seq, body FROM tail WHERE pos IN (SELECT value FROM json_each(?)) ORDER BY session_id, seq", (json.dumps(take),))
    if step_i >= len(order):
        c.execute("DELETE FROM tail WHERE pos <= ?", (cycle_max,)); cycle_max = None
    c.execute("COMMIT")
for tick in range(86):
    random.shuffle(sess)
    for i in range(0, S, 15):
        c.execute("BEGIN IMMEDIATE")
        for s in sess[i:i+15]:
            seq[s] += 1
            if mode == "direct":
                c.execute("INSERT INTO ev VALUES (?,?,?)", (s, seq[s], body))
            else:
                cur = c.execute("INSERT INTO tail (session_id, seq, body) VALUES (?,?,?)", (s, seq[s], body))
                idx.setdefault(s, []).append((cur.lastrowid, seq[s]))
            n += 1
        c.execute("COMMIT")
        if mode == "tail": step()
t = time.process_time()-t0
print(mode, S, "events", n, "frames/event %.3f" % ((frames()-f0)/n), "cpu us/event %.1f" % (t/n*1e6))

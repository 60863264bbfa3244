# A model, not a bench of omicos: SQLite's own cost per event for the event
# log's layout, run through Python's sqlite3 with the store's settings (WAL,
# synchronous=NORMAL, no autocheckpoint, foreign keys). S sessions each
# write 86 events; every 10 ms "tick" each session writes one, in batches
# (transactions) of 10 events from 10 random sessions, as the load bench's
# group commit sees at 100 turns.
#   keyed     today's layout: one table keyed (session_id, seq)
#   keyedint  the same keyed by an integer session number
#   tailrows  rows appended to a table in arrival order (no index); every K
#             batches one transaction moves them into the keyed table in
#             (session, seq) order and deletes them from the tail
#   tail      as tailrows, moved as one row per session (a chunk of bodies)
# Prints CPU µs per event and WAL frames per event, the last move of the
# tail included. Python's per-statement cost is in every figure, the same in
# every layout but `tail`, which also groups the rows in Python.
# Usage: python3 tail_model.py LAYOUT S [K]   (docs/benchmarks.md, 2026-12-04)
import os, random, shutil, sqlite3, struct, sys, time, uuid
S, E, B, K = int(sys.argv[2]), 86, 10, int(sys.argv[3]) if len(sys.argv) > 3 else 100
layout = sys.argv[1]
if layout not in ('keyed', 'keyedint', 'tailrows', 'tail'):
    sys.exit(f'unknown layout {layout!r}: keyed, keyedint, tailrows or tail')
d = f'/tmp/omicos-tail-model-{layout}'; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
c = sqlite3.connect(f'{d}/x.db', isolation_level=None)
for p in ['journal_mode=WAL', 'synchronous=NORMAL', 'wal_autocheckpoint=0', 'foreign_keys=ON', 'temp_store=memory']:
    c.execute('PRAGMA ' + p)
c.execute('CREATE TABLE sessions(id TEXT PRIMARY KEY)')
c.execute('CREATE TABLE ev(session_id TEXT NOT NULL REFERENCES sessions(id), seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY(session_id, seq))')
c.execute('CREATE TABLE evi(sid INTEGER NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY(sid, seq))')
c.execute('CREATE TABLE tail(pos INTEGER PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL)')
c.execute('CREATE TABLE chunks(session_id TEXT NOT NULL REFERENCES sessions(id), first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, bodies BLOB NOT NULL, PRIMARY KEY(session_id, last_seq))')
sess = [str(uuid.uuid4()) for _ in range(S)]
number = {s: i for i, s in enumerate(sess)}
c.executemany('INSERT INTO sessions VALUES (?)', [(s,) for s in sess])
body = os.urandom(90)
wal = f'{d}/x.db-wal'
w0 = os.path.getsize(wal)
def move_tail():
    """One transaction: the tail into the keyed table (tailrows) or into
    one chunk row per session (tail), then emptied."""
    c.execute('BEGIN IMMEDIATE')
    if layout == 'tailrows':
        c.execute('INSERT INTO ev SELECT session_id, seq, body FROM tail ORDER BY session_id, seq')
    else:
        by = {}
        for s, q, b in c.execute('SELECT session_id, seq, body FROM tail ORDER BY pos'):
            by.setdefault(s, []).append((q, b))
        c.executemany('INSERT INTO chunks VALUES (?,?,?,?)',
                      [(s, v[0][0], v[-1][0], b''.join(struct.pack('<I', len(b)) + b for _, b in v)) for s, v in by.items()])
    c.execute('DELETE FROM tail')
    c.execute('COMMIT')


t0 = time.process_time()
nb = 0
random.seed(7)
for seq in range(1, E + 1):
    order = sess[:]; random.shuffle(order)
    for i in range(0, S, B):
        rows = [(s, seq, body) for s in order[i:i + B]]
        c.execute('BEGIN IMMEDIATE')
        if layout == 'keyedint':
            c.executemany('INSERT INTO evi VALUES (?,?,?)', [(number[s], q, b) for s, q, b in rows])
        elif layout == 'keyed':
            c.executemany('INSERT INTO ev VALUES (?,?,?)', rows)
        else:
            c.executemany('INSERT INTO tail(session_id, seq, body) VALUES (?,?,?)', rows)
        c.execute('COMMIT')
        nb += 1
        if layout in ('tailrows', 'tail') and nb % K == 0:
            move_tail()
if layout in ('tailrows', 'tail') and nb % K != 0:
    move_tail()  # what the last K batches left
cpu = time.process_time() - t0
frames = (os.path.getsize(wal) - w0) / 4120
n = S * E
print(f'{layout:8s} S={S} K={K}: {1e6 * cpu / n:6.2f} us/event, {frames / n:5.2f} WAL frames/event')

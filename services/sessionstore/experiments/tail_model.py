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
# Prints CPU µs per event (Python's per-statement cost included, the same
# in every layout) and WAL frames per event.
# Usage: python3 tail_model.py LAYOUT S [K]   (docs/benchmarks.md, 2026-12-04)
import sqlite3, os, sys, time, uuid, struct, shutil
S, E, B, K = int(sys.argv[2]), 86, 10, int(sys.argv[3]) if len(sys.argv) > 3 else 100
layout = sys.argv[1]
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
c.executemany('INSERT INTO sessions VALUES (?)', [(s,) for s in sess])
body = os.urandom(90)
wal = f'{d}/x.db-wal'
w0 = os.path.getsize(wal)
t0 = time.process_time()
nb = 0
import random
random.seed(7)
for seq in range(1, E + 1):
    order = sess[:]; random.shuffle(order)
    for i in range(0, S, B):
        rows = [(s, seq, body) for s in order[i:i + B]]
        c.execute('BEGIN IMMEDIATE')
        if layout == 'keyedint':
            c.executemany('INSERT INTO evi VALUES (?,?,?)', [(sess.index(r[0]), r[1], r[2]) for r in rows])
        elif layout == 'keyed':
            c.executemany('INSERT INTO ev VALUES (?,?,?)', rows)
        else:
            c.executemany('INSERT INTO tail(session_id, seq, body) VALUES (?,?,?)', rows)
        c.execute('COMMIT')
        nb += 1
        if layout == 'tailrows' and nb % K == 0:
            c.execute('BEGIN IMMEDIATE')
            top = c.execute('SELECT max(pos) FROM tail').fetchone()[0]
            c.execute('INSERT INTO ev SELECT session_id, seq, body FROM tail WHERE pos <= ? ORDER BY session_id, seq', (top,))
            c.execute('DELETE FROM tail WHERE pos <= ?', (top,))
            c.execute('COMMIT')
        if layout == 'tail' and nb % K == 0:
            c.execute('BEGIN IMMEDIATE')
            top = c.execute('SELECT max(pos) FROM tail').fetchone()[0]
            by = {}
            for s, q, b in c.execute('SELECT session_id, seq, body FROM tail WHERE pos <= ? ORDER BY pos', (top,)):
                by.setdefault(s, []).append((q, b))
            c.executemany('INSERT INTO chunks VALUES (?,?,?,?)',
                          [(s, v[0][0], v[-1][0], b''.join(struct.pack('<I', len(b)) + b for _, b in v)) for s, v in by.items()])
            c.execute('DELETE FROM tail WHERE pos <= ?', (top,))
            c.execute('COMMIT')
cpu = time.process_time() - t0
frames = (os.path.getsize(wal) - w0) / 4120
n = S * E
print(f'{layout:5s} S={S} K={K}: {1e6 * cpu / n:6.2f} us/event, {frames / n:5.2f} WAL frames/event')

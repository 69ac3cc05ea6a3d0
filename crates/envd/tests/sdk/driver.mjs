// Drives the official e2b JavaScript SDK against oka-envd (started by tests/sdk_js.rs).
//
// Environment: OKA_E2B_JS (the directory holding node_modules/e2b), E2B_API_URL (the harness's fake
// control plane), E2B_SANDBOX_URL (the daemon), E2B_API_KEY, OKA_TEST_HOME (the default user's home),
// OKA_TEST_UID (its uid). Any failed check throws, which exits non-zero and fails the Rust test.
import { createRequire } from 'node:module'
import { randomBytes } from 'node:crypto'
import path from 'node:path'

const require = createRequire(path.join(process.env.OKA_E2B_JS, 'package.json'))
const e2b = require('e2b')
const { Sandbox, CommandExitError, FileType, FilesystemEventType } = e2b
const version = require('e2b/package.json').version

const HOME = process.env.OKA_TEST_HOME
const UID = process.env.OKA_TEST_UID
const checks = []

function check(name, cond, detail = '') {
  if (!cond) throw new Error(`${name}: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`)
  checks.push(name)
}

async function expectRejects(name, cls, fn) {
  try {
    await fn()
  } catch (e) {
    if (cls && !(e instanceof cls)) throw new Error(`${name}: expected ${cls.name}, got ${e}`)
    checks.push(name)
    return e
  }
  throw new Error(`${name}: expected ${cls ? cls.name : 'an error'}`)
}

async function until(name, cond, ms = 10000) {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (cond()) return
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`${name}: not reached within ${ms} ms`)
}

console.log(`e2b-js ${version} node ${process.versions.node}`)

const sbx = await Sandbox.create()
check('sandbox id', sbx.sandboxId === 'oka0test0sandbox0001', sbx.sandboxId)
check('isRunning', await sbx.isRunning())

// ---- commands ---------------------------------------------------------------------------------
let r = await sbx.commands.run('echo hi')
check('run stdout', r.stdout === 'hi\n' && r.exitCode === 0, r)
r = await sbx.commands.run('pwd; id -u; echo $HOME $USER')
check('default cwd/user', r.stdout.split(/\s+/).filter(Boolean).join(' ') === `${HOME} ${UID} ${HOME} user`, r.stdout)
r = await sbx.commands.run('echo $A-$GLOBAL_VAR-$E2B_SANDBOX', { envs: { A: '1' } })
check('envs', r.stdout === '1-from-init-true\n', r.stdout)
r = await sbx.commands.run('pwd; id -u', { cwd: '/tmp', user: 'root' })
check('cwd+root', r.stdout === '/tmp\n0\n', r.stdout)
let e = await expectRejects('exit 127', CommandExitError, () => sbx.commands.run('no_such_cmd_oka'))
check('127 code', e.exitCode === 127, e.exitCode)
check('127 stderr', e.stderr.includes('command not found'), e.stderr)
e = await expectRejects('exit 3', CommandExitError, () => sbx.commands.run('echo out; exit 3'))
check('exit 3 output', e.exitCode === 3 && e.stdout === 'out\n', e.stdout)
const out = []
const err = []
r = await sbx.commands.run('echo a; echo b >&2; echo c', {
  onStdout: (d) => out.push(d),
  onStderr: (d) => err.push(d),
})
check('callbacks', out.join('') === 'a\nc\n' && err.join('') === 'b\n', { out, err })
e = await expectRejects('bad cwd', null, () => sbx.commands.run('true', { cwd: '/no/such/dir' }))
check('bad cwd message', String(e.message).includes('does not exist'), String(e))
const big = await sbx.commands.run("head -c 300000 /dev/zero | tr '\\0' x")
check('large output', big.stdout.length === 300000, big.stdout.length)
const t0 = Date.now()
await expectRejects('timeout', null, () => sbx.commands.run('sleep 10', { timeoutMs: 1000 }))
check('timeout is prompt', Date.now() - t0 < 6000, Date.now() - t0)

let h = await sbx.commands.run('sleep 30', { background: true })
check('background pid', h.pid > 0, h.pid)
let listed = await sbx.commands.list()
const mine = listed.find((p) => p.pid === h.pid)
check('list', mine && mine.cmd === '/bin/bash' && mine.args.includes('sleep 30'), listed)
check('kill', await sbx.commands.kill(h.pid))
e = await expectRejects('killed wait', CommandExitError, () => h.wait())
check('killed code', e.exitCode === -1, e.exitCode)
check('kill unknown', (await sbx.commands.kill(999999)) === false)
listed = await sbx.commands.list()
check('gone from list', !listed.some((p) => p.pid === h.pid), listed)

h = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.3; done', { background: true })
const seen = []
const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
const r2 = await h2.wait()
check('connect', r2.exitCode === 0 && r2.stdout.trim().endsWith('3'), r2.stdout)
check('connect callback', seen.join('').trim().endsWith('3'), seen)
const r1 = await h.wait()
check('original handle', r1.stdout === '1\n2\n3\n', r1.stdout)
await expectRejects('connect unknown', null, () => sbx.commands.connect(999999))

h = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(h.pid, 'hello\n')
await h.sendStdin(new TextEncoder().encode('bytes\n'))
await sbx.commands.closeStdin(h.pid)
r = await h.wait()
check('stdin+close', r.stdout === 'hello\nbytes\n', r.stdout)

// A handle that disconnects leaves the process running; a new connect reattaches to it.
h = await sbx.commands.run('sleep 0.5; echo late', { background: true })
await h.disconnect()
check('disconnect keeps it listed', (await sbx.commands.list()).some((p) => p.pid === h.pid))
r = await (await sbx.commands.connect(h.pid)).wait()
check('reconnect after disconnect', r.stdout === 'late\n', r.stdout)

h = await sbx.commands.run('sleep 30', { background: true })
check('handle kill', await h.kill())
await expectRejects('handle killed', CommandExitError, () => h.wait())

// ---- pty --------------------------------------------------------------------------------------
const ptyData = []
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => ptyData.push(Buffer.from(d)) })
await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo ok-$((40+2))\n'))
await until('pty output', () => Buffer.concat(ptyData).includes('ok-42'))
const ptyText = Buffer.concat(ptyData).toString()
check('pty resize', ptyText.includes('30 100'), ptyText.slice(-500))
check('pty kill', await sbx.pty.kill(pty.pid))
await expectRejects('pty ended', null, () => pty.wait())

// ---- files ------------------------------------------------------------------------------------
const base = `${HOME}/files`
let info = await sbx.files.write(`${base}/a.txt`, 'hello')
check('write', info.path === `${base}/a.txt` && info.name === 'a.txt', info)
check('read text', (await sbx.files.read(`${base}/a.txt`)) === 'hello')
const bytes = await sbx.files.read(`${base}/a.txt`, { format: 'bytes' })
check('read bytes', Buffer.from(bytes).toString() === 'hello')
const blob = await sbx.files.read(`${base}/a.txt`, { format: 'blob' })
check('read blob', (await blob.text()) === 'hello')
const stream = await sbx.files.read(`${base}/a.txt`, { format: 'stream' })
const parts = []
for await (const c of stream) parts.push(Buffer.from(c))
check('read stream', Buffer.concat(parts).toString() === 'hello')
await sbx.files.write(`${base}/bin`, new Uint8Array([0, 1, 255]).buffer)
const bin = await sbx.files.read(`${base}/bin`, { format: 'bytes' })
check('bytes round trip', Buffer.from(bin).equals(Buffer.from([0, 1, 255])), bin)
await sbx.files.write(`${base}/empty`, '')
check('empty file', (await sbx.files.read(`${base}/empty`)) === '')
const payload = randomBytes(5 * 1024 * 1024)
await sbx.files.write(`${base}/big.bin`, new Blob([payload]))
check('large file', Buffer.from(await sbx.files.read(`${base}/big.bin`, { format: 'bytes' })).equals(payload))
await sbx.files.write(`${base}/gz.bin`, new Blob([payload]), { gzip: true })
check('gzip upload', Buffer.from(await sbx.files.read(`${base}/gz.bin`, { format: 'bytes', gzip: true })).equals(payload))
await sbx.files.write(
  `${base}/streamed.txt`,
  new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('str'))
      c.enqueue(new TextEncoder().encode('eamed'))
      c.close()
    },
  })
)
check('stream upload', (await sbx.files.read(`${base}/streamed.txt`)) === 'streamed')
info = await sbx.files.write(`${base}/octet.txt`, 'oct', { useOctetStream: true, metadata: { Owner: 'oka' } })
check('octet-stream upload', info.path === `${base}/octet.txt` && (await sbx.files.read(`${base}/octet.txt`)) === 'oct', info)
check('upload metadata', info.metadata && info.metadata.owner === 'oka', info)
await sbx.files.remove(`${base}/octet.txt`)
// File metadata: an upload sets the file's whole metadata, so a rewrite without metadata clears
// it, on every write path (multipart of one and of several files, octet-stream on the fast path and,
// gzipped, through the router).
const mbase = `${base}/meta`
async function metaOf(p) {
  const listed = await sbx.files.list(path.dirname(p))
  return [(await sbx.files.getInfo(p)).metadata, listed.find((e) => e.path === p).metadata]
}
// Metadata maps compare by their sorted entries (the answer's key order is the daemon's).
const norm = (m) => (Array.isArray(m) ? m.map(norm) : m && Object.entries(m).sort())
const same = (a, b) => JSON.stringify(norm(a)) === JSON.stringify(norm(b))
for (const [way, opts] of [['multipart', {}], ['octet-stream', { useOctetStream: true }], ['gzip', { gzip: true }]]) {
  const p = `${mbase}/${way}.txt`
  let want = { owner: 'oka', purpose: 'test' }
  info = await sbx.files.write(p, 'v1', { ...opts, metadata: { Owner: 'oka', purpose: 'test' } })
  check(`metadata ${way} answer`, same(info.metadata, want), info)
  let got = await metaOf(p)
  check(`metadata ${way} stat+list`, same(got, [want, want]), got)
  want = { purpose: 'replaced' }
  info = await sbx.files.write(p, 'v2', { ...opts, metadata: { purpose: 'replaced' } })
  check(`metadata ${way} replaced`, same(info.metadata, want), info)
  got = await metaOf(p)
  check(`metadata ${way} replaced stat+list`, same(got, [want, want]), got)
  info = await sbx.files.write(p, 'v3', opts)
  check(`metadata ${way} cleared answer`, info.metadata === undefined, info)
  got = await metaOf(p)
  check(`metadata ${way} cleared stat+list`, got[0] === undefined && got[1] === undefined, got)
  check(`metadata ${way} content`, (await sbx.files.read(p)) === 'v3')
}
for (const opts of [{}, { useOctetStream: true }]) {
  const files = ['a', 'b'].map((n) => ({ path: `${mbase}/many/${n}`, data: n }))
  let infos = await sbx.files.writeFiles(files, { ...opts, metadata: { batch: '1' } })
  check('metadata writeFiles', infos.length === 2 && infos.every((i) => same(i.metadata, { batch: '1' })), infos)
  infos = await sbx.files.writeFiles(files, opts)
  check('metadata writeFiles cleared', infos.every((i) => i.metadata === undefined), infos)
  for (const f of files) {
    const got = await metaOf(f.path)
    check('metadata writeFiles cleared stat+list', got[0] === undefined && got[1] === undefined, got)
  }
}
await sbx.files.remove(mbase)
r = await sbx.commands.run(`stat -c '%u %a' ${base}/a.txt ${base}`)
check('owner and modes', r.stdout.split(/\s+/).filter(Boolean).join(' ') === `${UID} 644 ${UID} 755`, r.stdout)
const infos = await sbx.files.write([
  { path: `${base}/m/1.txt`, data: 'one' },
  { path: `${base}/m/2.txt`, data: new TextEncoder().encode('two').buffer },
])
check('write multiple', infos.map((i) => i.name).sort().join(',') === '1.txt,2.txt', infos)
check('write multiple content', (await sbx.files.read(`${base}/m/2.txt`)) === 'two')
await sbx.files.writeFiles([{ path: `${base}/m/3.txt`, data: 'three' }])
check('writeFiles', (await sbx.files.read(`${base}/m/3.txt`)) === 'three')
let entries = await sbx.files.list(base)
const names = entries.map((x) => x.name).sort()
check('list depth 1', names.join(',') === 'a.txt,big.bin,bin,empty,gz.bin,m,streamed.txt', names)
check('list types', entries.find((x) => x.name === 'm').type === FileType.DIR, entries)
entries = await sbx.files.list(base, { depth: 2 })
const paths = entries.map((x) => x.path).sort()
check('list depth 2', paths.includes(`${base}/m/1.txt`) && paths.length === 10, paths)
check('exists', await sbx.files.exists(`${base}/a.txt`))
check('not exists', !(await sbx.files.exists(`${base}/nope`)))
let i = await sbx.files.getInfo(`${base}/a.txt`)
check('getInfo', i.type === FileType.FILE && i.size === 5 && i.name === 'a.txt' && i.mode === 0o644, i)
check('getInfo owner', i.owner === 'user' && i.permissions === '-rw-r--r--', i)
check('getInfo time', i.modifiedTime instanceof Date && Math.abs(i.modifiedTime - Date.now()) < 600000, i)
i = await sbx.files.getInfo(base)
check('getInfo dir', i.type === FileType.DIR, i)
check('makeDir', await sbx.files.makeDir(`${base}/d1/d2`))
check('makeDir again', (await sbx.files.makeDir(`${base}/d1/d2`)) === false)
const moved = await sbx.files.rename(`${base}/a.txt`, `${base}/new/b.txt`)
check('rename', moved.path === `${base}/new/b.txt` && moved.name === 'b.txt', moved)
check('renamed content', (await sbx.files.read(`${base}/new/b.txt`)) === 'hello')
await sbx.files.remove(`${base}/new`)
check('remove', !(await sbx.files.exists(`${base}/new/b.txt`)))
await expectRejects('read missing', e2b.FileNotFoundError, () => sbx.files.read(`${base}/nope`))
await expectRejects('list missing', e2b.FileNotFoundError, () => sbx.files.list(`${base}/nope`))
await expectRejects('getInfo missing', e2b.FileNotFoundError, () => sbx.files.getInfo(`${base}/nope`))
await expectRejects('read dir', null, () => sbx.files.read(base))

const events = []
const w = await sbx.files.watchDir(base, (ev) => events.push(ev), { includeEntry: true })
await sbx.files.write(`${base}/w.txt`, 'x')
await sbx.files.remove(`${base}/bin`)
const has = (name, type) => events.some((ev) => ev.name === name && ev.type === type)
// Both expected events (writes also bring chmod/write events first).
await until('watch events', () => has('w.txt', FilesystemEventType.CREATE) && has('bin', FilesystemEventType.REMOVE))
const created = events.find((ev) => ev.name === 'w.txt' && ev.type === FilesystemEventType.CREATE)
check('watch entry', !created.entry || created.entry.path === `${base}/w.txt`, created)
await w.stop()
const wr = await sbx.files.watchDir(`${base}/m`, (ev) => events.push(ev), { recursive: true })
await sbx.files.write(`${base}/m/sub/deep.txt`, 'd')
await until('recursive watch', () => events.some((ev) => ev.name.endsWith('deep.txt')))
await wr.stop()
await expectRejects('watch missing', null, () => sbx.files.watchDir(`${base}/nope`, () => {}))

const url = await sbx.downloadUrl(`${base}/w.txt`)
check('signed url', url.includes('signature=v1_'), url)
const res = await fetch(url)
check('signed download', res.status === 200 && (await res.text()) === 'x', res.status)

await sbx.kill()
console.log(`OK ${checks.length} checks`)

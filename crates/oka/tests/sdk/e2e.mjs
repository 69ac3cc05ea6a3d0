// Drives the official e2b JavaScript SDK against `oka serve` end to end (started by
// tests/sdk_e2e.rs), the same flow as e2e.py.
//
// Environment: E2B_API_URL (the manager), E2B_SANDBOX_URL (the gateway), E2B_API_KEY, OKA_RUN_ID,
// OKA_E2B_JS (the directory holding node_modules/e2b). A failed check exits non-zero.
import { createHash, randomBytes } from 'node:crypto'
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.OKA_E2B_JS, 'package.json'))
const { Sandbox } = require('e2b')
const RUN = process.env.OKA_RUN_ID

function check(name, cond, detail = '') {
  if (!cond) throw new Error(`${name}: ${detail}`)
  console.log(`ok ${name}`)
}

async function listedIds(state) {
  const pager = Sandbox.list({ query: { metadata: { run: RUN }, ...(state ? { state } : {}) } })
  const ids = []
  while (pager.hasNext) ids.push(...(await pager.nextItems()).map((s) => s.sandboxId))
  return ids
}

console.log(`e2b ${require('e2b/package.json').version}`)

// ---- create from the warm pool ----------------------------------------------------------------
const started = performance.now()
const sbx = await Sandbox.create('base', {
  timeoutMs: 120_000,
  envs: { FOO: 'from-create' },
  metadata: { run: RUN, who: 'e2e-js' },
})
check('create', /^[a-z0-9]+$/.test(sbx.sandboxId), sbx.sandboxId)
console.log(`create took ${(performance.now() - started).toFixed(1)} ms`)
let info = await sbx.getInfo()
check('getInfo', info.sandboxId === sbx.sandboxId && info.metadata.who === 'e2e-js', JSON.stringify(info))
check('getInfo state', info.state === 'running', info.state)

// ---- commands -----------------------------------------------------------------------------------
let r = await sbx.commands.run('echo $FOO; id -un; pwd')
check('run', r.stdout.split(/\s+/).filter(Boolean).join(' ') === 'from-create user /home/user', r.stdout)
try {
  await sbx.commands.run('echo oops >&2; exit 3')
  check('exit code', false, 'no error')
} catch (e) {
  check('exit code', e.exitCode === 3 && e.stderr.includes('oops'), String(e))
}
const out = []
r = await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => out.push(d) })
check('stdout callback', out.join('').includes('line3'), JSON.stringify(out))

// ---- files --------------------------------------------------------------------------------------
await sbx.files.write('/home/user/notes/a.txt', 'hello from the JS SDK')
check('files read', (await sbx.files.read('/home/user/notes/a.txt')) === 'hello from the JS SDK')
check('files list', (await sbx.files.list('/home/user/notes')).map((e) => e.name).join() === 'a.txt')
const payload = randomBytes(3 * 1024 * 1024)
await sbx.files.write('/tmp/blob.bin', payload)
const back = Buffer.from(await sbx.files.read('/tmp/blob.bin', { format: 'bytes' }))
check('files bytes', back.equals(payload))
r = await sbx.commands.run('sha256sum /tmp/blob.bin | cut -c1-16')
const digest = createHash('sha256').update(payload).digest('hex').slice(0, 16)
check('files seen by commands', r.stdout.trim() === digest, r.stdout)

// ---- background, list, timeout ------------------------------------------------------------------
const bg = await sbx.commands.run('sleep 600', { background: true })
check('background', (await sbx.commands.list()).some((p) => p.pid === bg.pid))
check('list', (await listedIds()).includes(sbx.sandboxId))
await sbx.setTimeout(90_000)
const left = ((await sbx.getInfo()).endAt.getTime() - Date.now()) / 1000
check('setTimeout', left >= 80 && left <= 91, left)

// ---- pause and resume ----------------------------------------------------------------------------
check('pause', (await sbx.pause()) === true)
info = await Sandbox.getInfo(sbx.sandboxId)
check('paused state', info.state === 'paused', info.state)
check('list paused', (await listedIds(['paused'])).includes(sbx.sandboxId))
check('pause twice', (await sbx.pause()) === false)
const resumed = await Sandbox.connect(sbx.sandboxId)
r = await resumed.commands.run('cat /home/user/notes/a.txt')
check('resumed keeps files', r.stdout === 'hello from the JS SDK', r.stdout)
check('resumed keeps processes', (await resumed.commands.list()).some((p) => p.pid === bg.pid))

// ---- kill ---------------------------------------------------------------------------------------
check('kill', (await resumed.kill()) === true)
check('kill again', (await Sandbox.kill(sbx.sandboxId)) === false)
try {
  await Sandbox.getInfo(sbx.sandboxId)
  check('gone', false, 'still there')
} catch (e) {
  check('gone', /not found/i.test(String(e)), String(e))
}
check('not listed after kill', !(await listedIds()).includes(sbx.sandboxId))
console.log('all checks passed')

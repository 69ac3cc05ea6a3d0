// E2B parity with the newest official e2b JavaScript SDK against `oka serve` (started by
// tests/sdk_e2e.rs; the same checks as parity.py, in the SDK's own words): short timeouts,
// setTimeout(0), the lifecycle of a create, the list's order and paging, and fork.
//
// Environment: E2B_API_URL (the manager), E2B_SANDBOX_URL (the gateway), E2B_API_KEY, OKA_RUN_ID,
// OKA_E2B_JS (the directory holding node_modules/e2b). A failed check exits non-zero.
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.OKA_E2B_JS, 'package.json'))
const { Sandbox } = require('e2b')
const RUN = process.env.OKA_RUN_ID

function check(name, cond, detail = '') {
  if (!cond) throw new Error(`${name}: ${JSON.stringify(detail)}`)
  console.log(`ok ${name}`)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** The state the API shows, or null once the sandbox is gone. */
async function stateOf(id) {
  try {
    return (await Sandbox.getInfo(id)).state
  } catch (error) {
    if (/not found/i.test(String(error))) return null
    throw error
  }
}

async function waitState(id, want, withinMs) {
  const deadline = Date.now() + withinMs
  for (;;) {
    const got = await stateOf(id)
    if (got === want) return Date.now()
    if (Date.now() > deadline) throw new Error(`${id} is ${got}, not ${want}, after ${withinMs} ms`)
    await sleep(100)
  }
}

let sleepers = 100000
/** A long-lived process, known by its PID and its command line: one that starts afresh after a
 *  resume may get the same PID number. */
async function startSleeper(sbx) {
  const command = `sleep ${++sleepers}`
  const handle = await sbx.commands.run(command, { background: true })
  return { pid: handle.pid, command }
}

async function alive(sbx, { pid, command }) {
  const out = await sbx.commands.run(`tr '\\0' ' ' < /proc/${pid}/cmdline 2>/dev/null; true`)
  return out.stdout.trim() === command
}

console.log(`e2b ${require('e2b/package.json').version}`)
const meta = { run: RUN }

// Short timeouts and setTimeout(0).
let started = Date.now()
let sbx = await Sandbox.create('base', { timeoutMs: 5_000, metadata: meta })
check('timeoutMs 5000 accepted', (await sbx.commands.run('echo hi')).stdout === 'hi\n')
let gone = ((await waitState(sbx.sandboxId, null, 20_000)) - started) / 1000
check('killed at its 5 s timeout', gone >= 4 && gone <= 12, gone)
sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: meta })
started = Date.now()
await sbx.setTimeout(0)
gone = ((await waitState(sbx.sandboxId, null, 10_000)) - started) / 1000
check('setTimeout(0) kills at once', gone < 5, gone)

// The list: newest first, paused and running in one order, filters before paging.
const made = []
for (let i = 0; i < 3; i++) {
  made.push(await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run: RUN, list: 'js' } }))
}
await made[1].pause()
const query = { metadata: { run: RUN, list: 'js' } }
async function walk(state, limit) {
  const paginator = Sandbox.list({ query: { ...query, state }, limit })
  const seen = []
  while (paginator.hasNext) seen.push(...(await paginator.nextItems()).map((s) => s.sandboxId))
  return seen
}
const newestFirst = made.map((s) => s.sandboxId).reverse()
for (const limit of [1, 2]) {
  const all = await walk(['running', 'paused'], limit)
  check(`list newest first (limit ${limit})`, JSON.stringify(all) === JSON.stringify(newestFirst), all)
  const paused = await walk(['paused'], limit)
  check(`paused only (limit ${limit})`, JSON.stringify(paused) === JSON.stringify([made[1].sandboxId]), paused)
}
const keyed = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { run: RUN, 'example.com/note': 'a b' } })
const found = await Sandbox.list({ query: { metadata: { 'example.com/note': 'a b' } } }).nextItems()
check('a metadata filter with a / key and a space', found.length === 1 && found[0].sandboxId === keyed.sandboxId, found)
for (const s of [...made, keyed]) await s.kill()

// Pause at the end with the memory, woken by connect only; in place.
sbx = await Sandbox.create('base', { timeoutMs: 3_000, metadata: meta, lifecycle: { onTimeout: 'pause' } })
const info = await Sandbox.getInfo(sbx.sandboxId)
check('lifecycle shown', info.lifecycle?.onTimeout === 'pause' && info.lifecycle?.autoResume === false, info.lifecycle)
let pid = await startSleeper(sbx)
await waitState(sbx.sandboxId, 'paused', 20_000)
const woken = await sbx.commands.run('echo woken', { requestTimeoutMs: 5_000 }).then(() => true, () => false)
check('traffic does not wake it without autoResume', !woken)
sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
check('connect resumed it in place', await alive(sbx, pid))
await sbx.kill()

// With autoResume, traffic wakes it.
sbx = await Sandbox.create('base', {
  timeoutMs: 3_000,
  metadata: meta,
  lifecycle: { onTimeout: 'pause', autoResume: true },
})
pid = await startSleeper(sbx)
await waitState(sbx.sandboxId, 'paused', 20_000)
check('traffic wakes it with autoResume', (await sbx.commands.run('echo woken')).stdout === 'woken\n')
check('woken in place', await alive(sbx, pid))
await sbx.kill()

// Files only: the processes start afresh at the resume.
sbx = await Sandbox.create('base', {
  timeoutMs: 3_000,
  metadata: meta,
  lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
})
await sbx.files.write('/home/user/kept.txt', 'files stay')
pid = await startSleeper(sbx)
await waitState(sbx.sandboxId, 'paused', 30_000)
sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
check('files kept', (await sbx.files.read('/home/user/kept.txt')) === 'files stay')
check('processes restarted', !(await alive(sbx, pid)))
// A memory pause resumed with onResume: 'reboot' starts afresh on its files.
pid = await startSleeper(sbx)
await sbx.pause({ keepMemory: true })
sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000, onResume: 'reboot' })
check('onResume reboot starts the processes afresh', !(await alive(sbx, pid)))
check('onResume reboot keeps the files', (await sbx.files.read('/home/user/kept.txt')) === 'files stay')
await sbx.kill()

// fork: the forks carry on from the source's files, with their own IDs and tokens.
sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run: RUN, fork: 'source' } })
await sbx.files.write('/home/user/state.txt', 'before the fork')
started = Date.now()
const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
console.log(`fork of 2 took ${Date.now() - started} ms`)
check('two forks', forks.length === 2 && forks.every((f) => !(f instanceof Error)), forks.map(String))
check('fresh IDs', new Set([sbx.sandboxId, ...forks.map((f) => f.sandboxId)]).size === 3)
for (const f of forks) {
  check('a fork has the files', (await f.files.read('/home/user/state.txt')) === 'before the fork')
  check('a fork has the metadata', (await f.getInfo()).metadata.fork === 'source')
}
check('the source runs', (await stateOf(sbx.sandboxId)) === 'running')
for (const s of [...forks, sbx]) await s.kill()

console.log('all checks passed')

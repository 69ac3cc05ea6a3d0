// A sandbox killed while requests are in flight, as the official e2b JavaScript SDK sees it
// (started by tests/sdk_e2e.rs; the same as killed.py).
//
// A command and a directory watch stream, a file read waits in envd (a FIFO with no writer) and a
// file upload is half sent when another client kills the sandbox. The SDK raises `TimeoutError`
// for a sandbox that is gone: a stream that breaks is followed by a `/health` probe through the
// gateway, whose 502 makes it "killed or reached its end of life"; a request answered with the
// gateway's 502 itself reads "sandbox timeout". Calls made after the kill fail the same way
// (starting a process: `SandboxNotFoundError`).
//
// Environment: E2B_API_URL (the manager), E2B_SANDBOX_URL (the gateway), E2B_API_KEY, OKA_RUN_ID,
// OKA_E2B_JS (the directory holding node_modules/e2b). A failed check exits non-zero.
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.OKA_E2B_JS, 'package.json'))
const { Sandbox, SandboxNotFoundError, TimeoutError } = require('e2b')
const RUN = process.env.OKA_RUN_ID

function check(name, cond, detail = '') {
  if (!cond) throw new Error(`${name}: ${detail}`)
  console.log(`ok ${name}`)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
/** Resolves with `value` after `ms`, without keeping the process alive. */
const after = (ms, value) => new Promise((r) => setTimeout(r, ms, value).unref())
/** The outcome of `promise`: `{ error }` when it rejects, `{}` when it resolves. */
const settle = (promise) => promise.then(() => ({}), (error) => ({ error }))
/** Whether `error` is the SDK's "the sandbox is gone"; `inFlight`: after a broken stream's probe. */
function gone(error, inFlight = false) {
  const wording = inFlight ? /killed or reached its end of life/ : /end of life|sandbox timeout/
  return error instanceof TimeoutError && wording.test(error.message)
}

console.log(`e2b ${require('e2b/package.json').version}`)

const sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run: RUN, who: 'killed-js' } })
await sbx.commands.run('mkdir -p /home/user/w && mkfifo /home/user/fifo')
check('running', await sbx.isRunning())

let started
const streaming = new Promise((resolve) => (started = resolve))
const command = settle(sbx.commands.run('echo started; sleep 120', { timeoutMs: 0, onStdout: () => started() }))
await streaming
check('command streams', true)

let watchEnded
const watchExit = new Promise((resolve) => (watchEnded = resolve))
await sbx.files.watchDir('/home/user/w', () => {}, { timeoutMs: 0, onExit: (error) => watchEnded(error) })
check('watch streams', true)

// Waits in envd: opening a FIFO blocks until a writer comes, and none does.
const read = settle(sbx.files.read('/home/user/fifo'))

let release
const released = new Promise((resolve) => (release = resolve))
const body = new ReadableStream({
  async start(controller) {
    controller.enqueue(new Uint8Array(1 << 20).fill(120))
    await released
    for (let i = 0; i < 32; i++) controller.enqueue(new Uint8Array(1 << 20).fill(121))
    controller.close()
  },
})
const upload = settle(sbx.files.write('/home/user/w/big.bin', body))
await sleep(1000) // the read and the first megabyte reach envd

check('kill', (await Sandbox.kill(sbx.sandboxId)) === true)
release()
const [commandEnd, watchError, readEnd, uploadEnd] = await Promise.all([
  command,
  Promise.race([watchExit, after(60_000, 'the watch did not end')]),
  read,
  upload,
])
check('command: killed while streaming', gone(commandEnd.error, true), commandEnd.error)
check('watch: killed while streaming', gone(watchError, true), watchError)
check('read: killed while waiting in envd', gone(readEnd.error), readEnd.error)
check('upload: killed while sending', gone(uploadEnd.error), uploadEnd.error)
check('isRunning after kill', (await sbx.isRunning()) === false)

for (const [name, call] of [
  ['list', () => sbx.files.list('/home/user')],
  ['write', () => sbx.files.write('/home/user/a', 'a')],
]) {
  const { error } = await settle(call())
  check(`${name} after kill`, gone(error), error)
}
// Starting a process (or a watch) reads the gateway's 502 as the sandbox not running.
const { error } = await settle(sbx.commands.run('true'))
check('run after kill', error instanceof SandboxNotFoundError, error)

console.log('all checks passed')

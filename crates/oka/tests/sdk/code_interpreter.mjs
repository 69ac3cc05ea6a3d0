// The newest @e2b/code-interpreter JavaScript SDK against `oka serve` (started by
// tests/sdk_e2e.rs), on the `code-interpreter-v1` pool: results as E2B's template gives them
// (a plot's png, text and chart, a DataFrame's data, results streamed to onResult), languages with
// their contexts, working directories and env vars, errors, contexts listed, restarted and
// removed, the interrupt on the SDK's timeout.
//
// Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID, OKA_E2B_JS (the directory
// holding node_modules/@e2b/code-interpreter). A failed check exits non-zero.
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.OKA_E2B_JS, 'package.json'))
const { Sandbox } = require('@e2b/code-interpreter')
const RUN = process.env.OKA_RUN_ID

function check(name, cond, detail = '') {
  if (!cond) throw new Error(`${name}: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`)
  console.log(`ok ${name}`)
}
const out = (ex) => ex.logs.stdout.join('')

console.log(`@e2b/code-interpreter ${require('@e2b/code-interpreter/package.json').version}`)
const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { run: RUN }, envs: { G_VAR: 'from-sandbox' } })
check('created from the code-interpreter-v1 pool', (await sbx.getInfo()).templateId === 'code-interpreter-v1')

let ex = await sbx.runCode("print('hello'); 1 + 1")
check('stdout and the main result', out(ex) === 'hello\n' && ex.text === '2', ex)

ex = await sbx.runCode(
  "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9], label='squares')\nplt.title('Squares')\nplt.xlabel('x (m)')\nplt.show()",
)
const [plot] = ex.results
check('plt.show() gives one display result', ex.results.length === 1 && plot.isMainResult === false, ex)
check('with a png', Buffer.from(plot.png, 'base64').subarray(1, 4).toString() === 'PNG')
check('with its text', plot.text.startsWith('<Figure size'), plot.text)
check('with a line chart', plot.chart.type === 'line' && plot.chart.title === 'Squares' && plot.chart.x_unit === 'm', plot.chart)
check('the line', JSON.stringify(plot.chart.elements) === JSON.stringify([{ label: 'squares', points: [[1, 1], [2, 4], [3, 9]] }]), plot.chart.elements)
check('formats', plot.formats().includes('png'), plot.formats())

ex = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
check("a DataFrame's data", JSON.stringify(ex.results[0].data) === '{"a":[1,2],"b":["x","y"]}' && ex.results[0].html.includes('<table'), ex.results)

const seen = []
const t0 = performance.now()
ex = await sbx.runCode("from IPython.display import display\nimport time\ndisplay('first')\ntime.sleep(2)\n'last'", {
  onResult: (r) => seen.push([performance.now() - t0, r.text]),
})
const took = performance.now() - t0
check('onResult streams each result while the code runs', seen.length === 2 && seen[0][1] === 'first' && seen[0][0] < took - 1500, { seen, took })

for (const [language, show] of [
  ['javascript', "console.log([Deno.cwd(), Deno.env.get('G_VAR'), Deno.env.get('X_VAR')].join(' '))"],
  ['typescript', "const v: string | undefined = Deno.env.get('X_VAR'); console.log([Deno.cwd(), Deno.env.get('G_VAR'), v].join(' '))"],
  ['bash', 'echo "$(pwd) $G_VAR $X_VAR"'],
  ['r', "cat(getwd(), Sys.getenv('G_VAR'), Sys.getenv('X_VAR'), '\\n')"],
]) {
  const ctx = await sbx.createCodeContext({ language, cwd: '/tmp' })
  check(`${language}: a context with its language and cwd`, ctx.language === language && ctx.cwd === '/tmp', ctx)
  ex = await sbx.runCode(show, { context: ctx, envs: { X_VAR: 'from-call' } })
  check(`${language}: cwd and the sandbox's and the call's env vars`, out(ex).trim() === '/tmp from-sandbox from-call', ex)
  check(`${language}: contexts are listed`, (await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  await sbx.restartCodeContext(ctx)
  await sbx.removeCodeContext(ctx)
  check(`${language}: a removed context is gone`, !(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
}

// Java (JJava): a JVM cannot change its own environment, so only the working directory.
const java = await sbx.createCodeContext({ language: 'java', cwd: '/tmp' })
ex = await sbx.runCode('System.out.println(System.getProperty("user.dir") + " " + (6 * 7));', { context: java })
check('java: a context with its cwd', out(ex).trim() === '/tmp 42', ex)
await sbx.removeCodeContext(java)

// The SDK's timeout interrupts the run (the gateway closes the sandbox's connection when the SDK
// gives up); the next run on the same context works and finds the context's state.
const busy = await sbx.createCodeContext({ language: 'python' })
await sbx.runCode('kept = 42', { context: busy })
const t1 = performance.now()
const timedOut = await sbx.runCode('while True: pass', { context: busy, timeoutMs: 2000 }).then(() => null, (e) => e)
check("the SDK's timeout ends a run", timedOut?.name === 'TimeoutError' && performance.now() - t1 < 10_000, String(timedOut))
ex = await sbx.runCode('kept', { context: busy, timeoutMs: 30_000 })
check('the context works after the interrupt, its state kept', ex.text === '42', ex)
await sbx.removeCodeContext(busy)

ex = await sbx.runCode("throw new TypeError('boom')", { language: 'javascript' })
check('an error with name, value and traceback', ex.error.name === 'TypeError' && ex.error.value === 'boom' && ex.error.traceback.includes('boom'), ex.error)

await sbx.kill()
console.log('all checks passed')

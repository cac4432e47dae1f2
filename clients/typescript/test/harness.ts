// A real `sessionfold serve` (SQLite and the embedded Redis in a temporary folder, an API key
// of its own) and `sessionfold standin` (the stand-in model) for the package's tests, run as
// the sessionfold command of this checkout's virtualenv (SESSIONFOLD_BIN to use another).

import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const BIN = process.env.SESSIONFOLD_BIN ??
  fileURLToPath(new URL("../../../../.venv/bin/sessionfold", import.meta.url));

/** The environment the children read their settings from: this folder's, nothing inherited
 *  that would point them elsewhere. */
function childEnv(dataDir: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!/^(SESSIONFOLD_|ANTHROPIC_|OPENAI_)|^(REDIS_URL|DATABASE_URL)$/.test(name)) {
      env[name] = value;
    }
  }
  return { ...env, SESSIONFOLD_DATA_DIR: dataDir, SESSIONFOLD_SUMMARIZER: "offline",
           SESSIONFOLD_METRICS_PORT: "0" };
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

/** Start `args`, and resolve with the first output line matching `ready` (its match). */
function started(args: string[], env: NodeJS.ProcessEnv, ready: RegExp):
    Promise<{ child: ChildProcess; match: RegExpMatchArray }> {
  const child = spawn(BIN, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`sessionfold ${args[0]} did not start in 60 s:\n${output}`));
    }, 60_000);
    const read = (data: Buffer): void => {
      output += data.toString();
      const match = output.match(ready);
      if (match) {
        clearTimeout(timer);
        resolve({ child, match });
      }
    };
    child.stdout?.on("data", read);
    child.stderr?.on("data", read);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`sessionfold ${args[0]} exited (${code}):\n${output}`));
    });
  });
}

async function stopped(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** A `sessionfold serve` of the test's own. */
export class Api {
  private constructor(readonly url: string, readonly key: string, private readonly dir: string,
                      private readonly child: ChildProcess) {}

  static async start(): Promise<Api> {
    const dir = await mkdtemp(join(tmpdir(), "sessionfold-ts-"));
    const env = childEnv(join(dir, "data"));
    const { stdout } = await promisify(execFile)(BIN, ["keys", "create", "ts-tests"], { env });
    const port = await freePort();
    const { child } = await started(["serve", "--port", String(port)], env,
                                    /sessionfold serve: http:\/\//);
    return new Api(`http://127.0.0.1:${port}`, stdout.trim(), dir, child);
  }

  async stop(): Promise<void> {
    await stopped(this.child);
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** `sessionfold standin`: the stand-in model, playing `script` (replies as its --script takes
 *  them) and then echoing. */
export class StandIn {
  private constructor(readonly url: string, private readonly child: ChildProcess,
                      private readonly dir: string) {}

  static async start(script: unknown[] | null = null, ...flags: string[]): Promise<StandIn> {
    const dir = await mkdtemp(join(tmpdir(), "sessionfold-standin-"));
    const args = ["standin", "--port", "0", ...flags];
    if (script !== null) {
      await writeFile(join(dir, "script.json"), JSON.stringify(script));
      args.push("--script", join(dir, "script.json"));
    }
    const { child, match } = await started(args, childEnv(join(dir, "data")),
                                           /sessionfold standin: (http:\/\/\S+)/);
    return new StandIn(match[1]!, child, dir);
  }

  async stop(): Promise<void> {
    await stopped(this.child);
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** A session id no other test uses. */
export function sessionId(name: string): string {
  return `${name}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

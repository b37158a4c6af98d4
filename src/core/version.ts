/** berth's version, reported by the CLI and both servers. */
export const VERSION = "0.1.0";

/**
 * A TCP proxy in front of the coordinator that cuts the connection of the
 * first borrow request just as the coordinator's answer arrives: the request
 * was served, its reply is lost (the client sees a reset connection).
 */
import { connect, createServer, type AddressInfo, type Server } from "node:net";

export interface CutProxy {
  url: string;
  /** How many answers were cut (at most one). */
  cut(): number;
  close(): Promise<void>;
}

export async function cutFirstBorrowReply(coordinatorUrl: string): Promise<CutProxy> {
  const target = new URL(coordinatorUrl);
  let cut = 0;
  const server: Server = createServer((down) => {
    const up = connect(Number(target.port), target.hostname);
    let borrowing = false;
    down.on("data", (d: Buffer) => {
      if (/^POST \/v1\/pools\/[^/]+\/borrow /.test(d.toString("latin1"))) borrowing = true;
      up.write(d);
    });
    up.on("data", (d: Buffer) => {
      if (borrowing && cut === 0) {
        cut++;
        down.destroy();
        up.destroy();
        return;
      }
      borrowing = false;
      down.write(d);
    });
    const end = () => (down.destroy(), up.destroy());
    down.on("error", end).on("close", end);
    up.on("error", end).on("close", end);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cut: () => cut,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

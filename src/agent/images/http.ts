/**
 * The agent's image routes (host-call authentication, like every agent route):
 *
 *   GET  /v1/agent/images                 -> {images: [ImageView], maxBytes, usedBytes}
 *   POST /v1/agent/images/{image}/remove  -> {id, size}   (`conflict` while a machine uses it)
 *
 * The coordinator reaches them for `berth image ls|rm` (coordinator/http/image-routes.ts).
 */
import type { IncomingMessage } from "node:http";
import type { HttpServer } from "../../http/server.js";
import type { ImageCache } from "./cache.js";

export function registerImageRoutes(app: HttpServer, auth: { auth: (req: IncomingMessage) => void }, images: ImageCache | null): void {
  app.get("/v1/agent/images", auth, async () => {
    const list = images?.list() ?? [];
    return { images: list, maxBytes: images?.maxBytes ?? 0, usedBytes: list.reduce((s, i) => s + i.size, 0) };
  });
  app.post("/v1/agent/images/:image/remove", auth, async (req) => {
    if (!images) return { id: null, size: 0, note: "this agent's runtime boots no images" };
    return images.remove(req.params.image!);
  });
}

import { describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { ATTACHED_FILES, baseName, formatSize, joinAttachments, overLimits, splitAttachments, uploadFailure } from "./attachments";

describe("attachments", () => {
  it("writes sizes as the server does", () => {
    expect(formatSize(0)).toBe("0 bytes");
    expect(formatSize(12)).toBe("12 bytes");
    expect(formatSize(1023)).toBe("1023 bytes");
    expect(formatSize(1536)).toBe("1.5 KB");
    expect(formatSize(12 * 1024)).toBe("12 KB");
    expect(formatSize(25 << 20)).toBe("25 MB");
    expect(formatSize(30.4 * 1024 * 1024)).toBe("30 MB");
    expect(formatSize(3 * 1024 ** 3)).toBe("3 GB");
  });

  it("splits the attachment line off a sent message", () => {
    const m = `sum it\n\n${ATTACHED_FILES} uploads/data.csv (12 KB)`;
    expect(splitAttachments(m)).toEqual({ text: "sum it", files: [{ path: "uploads/data.csv", size: "12 KB" }], line: `${ATTACHED_FILES} uploads/data.csv (12 KB)` });
    // A clash renamed the second copy; names may hold brackets and commas.
    const two = `${ATTACHED_FILES} uploads/data (1).csv (2 bytes), uploads/a, b (final).txt (1.5 KB)`;
    expect(splitAttachments(`two files\nplease\n\n${two}`)).toEqual({
      text: "two files\nplease",
      files: [
        { path: "uploads/data (1).csv", size: "2 bytes" },
        { path: "uploads/a, b (final).txt", size: "1.5 KB" },
      ],
      line: two,
    });
    // Files alone: no text.
    expect(splitAttachments(`${ATTACHED_FILES} uploads/x (1 bytes)`).text).toBe("");
  });

  it("leaves a message alone when it only quotes the words", () => {
    for (const m of [
      "plain",
      `${ATTACHED_FILES} uploads/x (1 bytes)\nand more`,
      `text ${ATTACHED_FILES} uploads/x (1 bytes)`,
      `text\n\n${ATTACHED_FILES} nothing sized here`,
      `text\n\n${ATTACHED_FILES} uploads/x (1 bytes) trailing`,
    ]) {
      expect(splitAttachments(m)).toEqual({ text: m, files: [], line: "" });
    }
  });

  it("keeps the line when an edited message is sent again", () => {
    const line = `${ATTACHED_FILES} uploads/x (1 bytes)`;
    expect(joinAttachments("edited", line)).toBe(`edited\n\n${line}`);
    expect(joinAttachments("  ", line)).toBe(line);
    expect(joinAttachments("edited", "")).toBe("edited");
    expect(splitAttachments(joinAttachments("edited", line)).text).toBe("edited");
  });

  it("names a file by the last part of its path", () => {
    expect(baseName("uploads/data (1).csv")).toBe("data (1).csv");
    expect(baseName("x")).toBe("x");
  });

  it("says what to do when an upload is refused", () => {
    expect(uploadFailure(Code.ResourceExhausted, "data.csv is 30 MB; the limit is 25 MB (uploads.max_file_bytes). Nothing was written", false)).toBe(
      "data.csv is 30 MB; the limit is 25 MB. Attach a smaller file. Your message and files are still here.",
    );
    expect(
      uploadFailure(
        Code.ResourceExhausted,
        "the files hold 60 MB together; the limit of one upload is 50 MB (uploads.max_request_bytes). Nothing was written; send them in parts",
        false,
      ),
    ).toBe("The files hold 60 MB together; the limit of one upload is 50 MB. Send the files in parts: fewer at a time. Your message and files are still here.");
    expect(uploadFailure(Code.ResourceExhausted, "21 files in one upload; the limit is 20 (uploads.max_files)", false)).toBe(
      "21 files in one upload; the limit is 20. Attach fewer files at a time. Your message and files are still here.",
    );
    expect(uploadFailure(Code.InvalidArgument, 'the file name "a\\nb" holds a control character', false)).toContain("Rename the file");
    expect(uploadFailure(Code.Unavailable, "", true)).toContain("the server cannot be reached");
    expect(uploadFailure(Code.Internal, "boom", false)).toBe("The files were not attached: boom. Try again. Your message and files are still here.");
  });

  it("says before sending what the server's limits would refuse, in the server's words", () => {
    const limits = { maxFileBytes: 1 << 20, maxRequestBytes: 3 << 20, maxFiles: 3 };
    const mb = (n: number) => ({ name: `f${n}.bin`, size: n << 20 });
    expect(overLimits([mb(1), { name: "a.txt", size: 12 }], limits)).toBeNull();
    expect(overLimits([{ name: "big.bin", size: 2 << 20 }], limits)).toBe(
      "big.bin is 2 MB; the limit is 1 MB. Attach a smaller file. Your message and files are still here.",
    );
    expect(overLimits([{ name: "a", size: 1 }, { name: "b", size: 1 }, { name: "c", size: 1 }, { name: "d", size: 1 }], limits)).toBe(
      "4 files in one upload; the limit is 3. Attach fewer files at a time. Your message and files are still here.",
    );
    const four = [mb(1), mb(1), mb(1), { name: "x", size: 1 }];
    expect(overLimits(four, { ...limits, maxFiles: 10 })).toMatch(/^The files hold 3\.0 MB together|^The files hold 3 MB together/);
    expect(overLimits(four, { ...limits, maxFiles: 10 })).toContain("Send the files in parts: fewer at a time.");
    // Unknown limits (an older server): nothing is said here; the server decides.
    expect(overLimits([{ name: "big.bin", size: 1 << 30 }], { maxFileBytes: 0, maxRequestBytes: 0, maxFiles: 0 })).toBeNull();
  });
});

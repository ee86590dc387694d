/* frame.h: the exl3kit frame stream (man/exl3-frames.5).
 *
 * A stream is a sequence of frames; each frame is a complete single-tensor
 * safetensors record: u64 LE header length N, N bytes of JSON header
 * {"<name>": {"dtype","shape","data_offsets"}, "__metadata__": {...}},
 * then the payload. __metadata__ always carries "x3f" (format version) and
 * "xxh3" (16 hex digits, XXH3-64 of the payload), verified on read.
 * Read and written strictly sequentially: pipes and sockets work.
 * A stream may be zstd-compressed as a whole (detected by magic). */
#ifndef X3_FRAME_H
#define X3_FRAME_H

#include "x3.h"

#define X3_FRAME_VERSION "1"
#define X3_FRAME_MAX_HEADER (100u * 1000 * 1000)   /* bytes of JSON */
#define X3_FRAME_MAX_PAYLOAD ((uint64_t)1 << 46)   /* 64 TiB, sanity */

typedef struct x3_reader x3_reader;
typedef struct x3_writer x3_writer;

/* Open a stream on fd (not closed by x3_reader_close unless own_fd).
 * label names the stream in messages ("stdin", a file name). */
int x3_reader_open_fd(int fd, const char *label, int own_fd, x3_reader **out);
/* path "-" means stdin. */
int x3_reader_open(const char *path, x3_reader **out);
/* Next whole frame (header + payload, checksum verified).
 * X3_OK, X3_EOF at a clean end of stream, or an error. */
int x3_reader_next(x3_reader *r, x3_tensor **out);
/* Streaming interface: header only (t->data == NULL, t->nbytes set), then
 * the payload in chunks of any size with x3_reader_data until nbytes have
 * been read; the checksum is verified when the last byte arrives (the call
 * that completes the payload returns X3_EFORMAT on mismatch). */
int x3_reader_next_header(x3_reader *r, x3_tensor **out);
int x3_reader_data(x3_reader *r, void *buf, size_t n);
/* The checksum the current frame's header declares. */
uint64_t x3_reader_checksum(const x3_reader *r);
/* Read the whole payload of the header t (from x3_reader_next_header) into
 * memory that t owns. */
int x3_reader_load(x3_reader *r, x3_tensor *t);
/* Zero-copy variant of x3_reader_data: *p points to up to max payload bytes
 * inside the reader's buffer (valid until the next call), *got says how many
 * (at least 1 unless an error is returned). */
int x3_reader_peek(x3_reader *r, const void **p, size_t max, size_t *got);
/* Skip the rest of the current payload (still verifying it). */
int x3_reader_skip(x3_reader *r);
/* Frame index (0-based) of the last header read, for messages. */
long x3_reader_index(const x3_reader *r);
const char *x3_reader_label(const x3_reader *r);
void x3_reader_close(x3_reader *r);

/* zstd_level 0: plain; 1..22: compress the whole stream. */
int x3_writer_open_fd(int fd, int zstd_level, x3_writer **out);
/* Whole tensor (computes the checksum). */
int x3_writer_put(x3_writer *w, const x3_tensor *t);
/* Streaming: header with a known checksum of the payload (t->data ignored,
 * t->nbytes must be set), then exactly t->nbytes bytes with put_data. */
int x3_writer_put_header(x3_writer *w, const x3_tensor *t, uint64_t xxh3);
int x3_writer_put_data(x3_writer *w, const void *buf, size_t n);
/* Flush (finishing any zstd frame). Does not close the fd. */
int x3_writer_flush(x3_writer *w);
/* Flush and free; returns the first error seen. */
int x3_writer_close(x3_writer *w);

/* What a SOURCE argument is: "-" and zstd or frame files are frame
 * streams; directories are model directories; other files safetensors. */
enum { X3_SRC_FRAMES = 1, X3_SRC_SAFETENSORS = 2, X3_SRC_DIR = 3 };
int x3_source_kind(const char *path, int *kind);

/* Read every frame of a stream into an array (for small streams).
 * *out is a malloc'd array of *n tensors. */
int x3_read_all(const char *path, x3_tensor ***out, int *n);
void x3_tensors_free(x3_tensor **v, int n);

#endif

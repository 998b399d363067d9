/* server/files/ internals shared by its files. */
#ifndef MPS_SERVER_FILES_INTERNAL_H
#define MPS_SERVER_FILES_INTERNAL_H

#include "server/files/files.h"

/* How much of a file the sniffers look at. */
#define FILES_SNIFF_BYTES 4096

/* mime.c: is this one of the image types files_sniff_image returns? */
bool files_mime_is_image(const char *mime);

#endif

package bronzelines;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.sql.api.java.UDF1;

/**
 * A landing file's bytes to its lines' bytes, split on '\n' only and copied as they are: a '\r'
 * before it, bytes that are not UTF-8 and a BOM stay in the line (bronze keeps every byte).
 * A final '\n' ends the last line rather than starting an empty one; every other empty line is a
 * line of its own. An empty file has no line. Registered as bronze_split_lines by the transform
 * that calls it (bronze/transform.py).
 */
public final class SplitLines implements UDF1<byte[], List<byte[]>> {
    private static final long serialVersionUID = 1L;

    @Override
    public List<byte[]> call(byte[] content) {
        if (content == null) {
            return null;
        }
        List<byte[]> lines = new ArrayList<>();
        int start = 0;
        for (int i = 0; i < content.length; i++) {
            if (content[i] == '\n') {
                lines.add(Arrays.copyOfRange(content, start, i));
                start = i + 1;
            }
        }
        if (start < content.length) {
            lines.add(Arrays.copyOfRange(content, start, content.length));
        }
        return lines;
    }
}
